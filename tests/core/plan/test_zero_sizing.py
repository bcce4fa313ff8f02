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


def sized(nodes: int, gpus: int, accum: int, bandwidth: str | None = None):
    bps, link, _ = link_for(nodes, "cuda", parse_bandwidth(bandwidth) if bandwidth else None)
    return size_zero(
        PARAMS,
        nodes=nodes,
        world=nodes * gpus,
        grad_accum=accum,
        precision="bf16",
        bytes_per_value=2,
        bytes_per_s=bps,
        link=link,
    )


@pytest.mark.parametrize(
    "nodes, gpus, accum, stage, bucket, overlap",
    [
        (1, 8, 2, 1, 20_000_000, False),  # 8gpu-h100's topology: accumulating, one node
        (1, 8, 1, 2, 20_000_000, False),
        (1, 1, 32, 1, 20_000_000, False),  # 1gpu-h100's
        (2, 8, 1, 2, 3_000_000, True),  # 16gpu-h100's
        (8, 8, 1, 2, 3_000_000, True),  # 64gpu-h100's
        (2, 8, 4, 1, 3_000_000, True),
    ],
)
def test_stage_buckets_and_overlap_by_topology_and_accumulation(nodes, gpus, accum, stage, bucket, overlap):
    z = sized(nodes, gpus, accum)
    assert (z.stage, z.bucket, z.overlap) == (stage, bucket, overlap)
    assert z.stage_why.startswith(f"ZeRO-{stage}: accumulation {accum}")
    if nodes == 1:
        # one right-sized bucket: at least the whole gradient, and no more than 2x it
        assert PARAMS <= z.bucket < 2 * PARAMS
        assert f"{PARAMS:,}-element gradient" in z.bucket_why and z.overlap_why.startswith("off: ")
    else:
        # a few million elements: several buckets, so reduction can overlap backward
        assert 1_000_000 <= z.bucket <= PARAMS / 3
        assert "in 4 buckets" in z.bucket_why and z.overlap_why.startswith("on: ")


def test_the_stage_reason_carries_the_bytes_it_saves():
    z = sized(1, 8, 2)
    # 8 GPUs, bf16: f = 7/8 of 22.6 MB; ZeRO-1 2f P = 39.6 MB, ZeRO-2 (2 + 1) f P = 59.4 MB
    assert "39.6 MB per GPU per step against ZeRO-2's 59.4 MB" in z.stage_why
    assert bytes_per_optimizer_step(PARAMS, 2, 8, 1, 2) == pytest.approx(39.6e6, rel=1e-3)


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
    assert lines[1].startswith("ZeRO-2 at accumulation 2 reduces gradients after every micro-batch: 59.4 MB")
    assert "against 39.6 MB under ZeRO-1" in lines[1]
    assert lines[2].startswith(
        "sized for this gradient: buckets of 2e+07, overlap_comm off, 40 MB of buffers"
    )
    # the shipped preset is sized already: no advice about its buckets
    shipped = make_plan(load_preset("8gpu-h100").config).deepspeed
    assert "bucket buffers 40 MB per GPU" in shipped[0]
    assert not any(l.startswith("sized for") for l in shipped)
