"""DeepSpeed sized from arithmetic (core/plan/zero.py): the stage, buckets and overlap for 1 node
and several, accumulation 1 and more, each with its reason; and what the planner says a config's
own choice costs (bytes per step, HBM of the bucket buffers)."""

from __future__ import annotations

import pytest

from taehv_console.core.plan.communication import bytes_per_optimizer_step, link_for, parse_bandwidth
from taehv_console.core.plan.planner import make_plan
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.plan.zero import size_zero, sized_bucket

PARAMS = 11_315_539  # the published TAEHV


@pytest.fixture(autouse=True)
def no_user_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TAEHV_CONSOLE_PRESETS", str(tmp_path / "none"))


def sized(nodes: int, gpus: int, accum: int, bandwidth: str | None = None, precision: str = "bf16"):
    bps, link, _ = link_for(nodes, "cuda", parse_bandwidth(bandwidth) if bandwidth else None)
    return size_zero(
        PARAMS,
        nodes=nodes,
        world=nodes * gpus,
        grad_accum=accum,
        precision=precision,
        bytes_per_value=2 if precision == "bf16" else 4,
        bytes_per_s=bps,
        link=link,
    )


@pytest.mark.parametrize(
    "nodes, gpus, accum, precision, stage, bucket, overlap",
    [
        (1, 8, 2, "bf16", 1, 20_000_000, False),  # 8gpu-h100's topology: accumulating, one node
        (1, 8, 1, "bf16", 2, 20_000_000, False),
        (1, 1, 32, "bf16", 1, 20_000_000, False),  # 1gpu-h100's
        (2, 8, 1, "bf16", 2, 3_000_000, True),  # 16gpu-h100's
        (8, 8, 1, "bf16", 2, 3_000_000, True),  # 64gpu-h100's
        # accumulating across nodes: ZeRO-1; in bf16 DeepSpeed's BF16_Optimizer reduces the whole
        # gradient at the step (nothing to overlap), in fp32 the bucketed ZeRO-1 overlaps
        (2, 8, 4, "bf16", 1, 3_000_000, False),
        (2, 8, 4, "no", 1, 3_000_000, True),
    ],
)
def test_stage_buckets_and_overlap_by_topology_and_accumulation(
    nodes, gpus, accum, precision, stage, bucket, overlap
):
    z = sized(nodes, gpus, accum, precision=precision)
    assert (z.stage, z.bucket, z.overlap) == (stage, bucket, overlap)
    assert z.stage_why.startswith(f"ZeRO-{stage}: accumulation {accum}")
    assert z.overlap_why.startswith("on: " if overlap else "off: ")
    if nodes == 1:
        # one right-sized bucket: at least the whole gradient, and no more than 2x it
        assert PARAMS <= z.bucket < 2 * PARAMS
        assert f"{PARAMS:,}-element gradient" in z.bucket_why
    else:
        # a few million elements: several buckets, so reduction can overlap backward
        assert 1_000_000 <= z.bucket <= PARAMS / 3
        assert "in 4 buckets" in z.bucket_why
    assert ("BF16_Optimizer" in z.overlap_why) is (stage == 1 and precision == "bf16")


def test_the_stage_reason_carries_the_bytes_it_saves():
    # 8 GPUs, bf16: f = 7/8 of P = 22.6 MB. ZeRO-2 reduce-scatters after each micro-batch and
    # all-gathers once: (A + 1) f P. bf16 ZeRO-1 (BF16_Optimizer) all-reduces once and all-gathers:
    # 3 f P = 59.4 MB, the same as ZeRO-2 at accumulation 2 and a third of it at 8
    assert "59.4 MB per GPU per step against ZeRO-2's 59.4 MB" in sized(1, 8, 2).stage_why
    at8 = sized(1, 8, 8).stage_why
    assert "59.4 MB per GPU per step against ZeRO-2's 178.2 MB" in at8 and "BF16_Optimizer" in at8
    # fp32 ZeRO-1 (the bucketed optimizer): reduce-scatter + all-gather, 2 f P of 4-byte values
    fp32 = sized(1, 8, 2, precision="no").stage_why
    assert "79.2 MB per GPU per step against ZeRO-2's 118.8 MB" in fp32 and "BF16_Optimizer" not in fp32
    assert bytes_per_optimizer_step(PARAMS, 2, 8, 1, 2) == pytest.approx(39.6e6, rel=1e-3)
    assert bytes_per_optimizer_step(PARAMS, 2, 8, 1, 2, bf16_zero1=True) == pytest.approx(59.4e6, rel=1e-3)


def test_the_bucket_reason_follows_the_link():
    slow = sized(2, 8, 1, "10Gbit")
    fast = sized(2, 8, 1, "100Gbit")
    assert slow.bucket == fast.bucket == 3_000_000  # the size follows the gradient, the reason the link
    assert "over inter-node 10Gbit, each 6.0 ms" in slow.bucket_why
    assert "over inter-node 100Gbit, each 0.6 ms" in fast.bucket_why


def test_a_given_stage_is_kept_with_its_reason():
    bps, link, _ = link_for(2, "cuda")
    z = size_zero(
        PARAMS,
        nodes=2,
        world=16,
        grad_accum=1,
        precision="bf16",
        bytes_per_value=2,
        bytes_per_s=bps,
        link=link,
        stage=3,
        stage_why="ZeRO-3: asked",
    )
    assert (z.stage, z.stage_why, z.bucket, z.overlap) == (3, "ZeRO-3: asked", 3_000_000, True)


def test_sized_bucket_rounds():
    assert sized_bucket(PARAMS, 1) == 20_000_000
    assert sized_bucket(4_000_000, 1) == 5_000_000
    assert sized_bucket(PARAMS, 3) == 3_000_000  # 11.3M / 4 = 2.83M, up to whole millions
    assert sized_bucket(1_000, 2) == 1_000_000  # never under a million elements


def test_the_planner_states_what_zero3_costs_the_published_presets():
    for name, world in (("16gpu-h100", 16), ("64gpu-h100", 64)):
        lines = make_plan(load_preset(name).config).deepspeed
        f = (world - 1) / world
        z3, z2 = 3 * f * PARAMS * 2 / 1e6, 2 * f * PARAMS * 2 / 1e6
        line = next(l for l in lines if l.startswith("ZeRO-3 costs"))
        assert f"{z3:.1f} MB per GPU per step against {z2:.1f} MB under ZeRO-2 (+50%" in line
        assert "in HBM it saves" in line and "MB of buffers (ZeRO-2: 12 MB)" in line
        # the GPU presets compile, which ZeRO-3's hooks break: said, with both ways out
        (compiled,) = [l for l in lines if l.startswith("model.compile under ZeRO-3")]
        assert "--set deepspeed.zero_stage=2" in compiled and "--set model.compile=false" in compiled
    # ZeRO-2 compiles each stage whole: nothing to say
    lines = make_plan(load_preset("8gpu-h100").config).deepspeed
    assert load_preset("8gpu-h100").config.model.compile
    assert not [l for l in lines if l.startswith("model.compile under ZeRO-3")]


def test_the_planner_prices_the_published_buckets_and_zero2_accumulation():
    # the public 8-GPU values: ZeRO-2 at accumulation 2, buckets of 5e8 with overlap: 2 x 5e8 bf16
    cfg = load_preset(
        "8gpu-h100",
        overrides=[
            "deepspeed.reduce_bucket_size=500000000",
            "deepspeed.allgather_bucket_size=500000000",
            "deepspeed.overlap_comm=true",
        ],
    ).config
    lines = make_plan(cfg).deepspeed
    assert lines[0] == (
        "ZeRO-2, buckets of 5e+08 elements (1 per gradient), overlap_comm on: 59.4 MB per GPU per step, "
        "bucket buffers 2,000 MB per GPU"
    )
    # at accumulation 2 bf16 ZeRO-1 moves as much as ZeRO-2: no advice on the stage
    assert lines[1].startswith(
        "sized for this gradient: buckets of 2e+07, overlap_comm off, 40 MB of buffers"
    )
    # 8gpu-a800 accumulates 8 micro-batches: ZeRO-2 moves 3x what ZeRO-1 would
    a800 = make_plan(load_preset("8gpu-a800").config).deepspeed
    assert a800[1] == (
        "ZeRO-2 at accumulation 8 reduces gradients after every micro-batch: 178.2 MB per GPU per step "
        "against 59.4 MB under ZeRO-1 (--set deepspeed.zero_stage=1)"
    )
    # the shipped preset is sized already: no advice about its buckets
    shipped = make_plan(load_preset("8gpu-h100").config).deepspeed
    assert "bucket buffers 40 MB per GPU" in shipped[0]
    assert not any(l.startswith("sized for") for l in shipped)
