"""derive_run_config and auto_select: checked values, and a reason for each derived one."""

from __future__ import annotations

import pytest

from taehv_console.core.plan.derive import (
    DeriveError,
    auto_select,
    collective_timeout_s,
    derive_run_config,
    lr_for,
)
from taehv_console.core.plan.planner import gpu_family
from taehv_console.core.plan.presets import list_presets, load_preset
from taehv_console.core.plan.timeouts import derived_collective_timeout_s


@pytest.fixture(autouse=True)
def no_user_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TAEHV_CONSOLE_PRESETS", str(tmp_path / "none"))


@pytest.fixture(scope="module")
def h100():
    return load_preset("8gpu-h100", user_dir=None)


def values(cfg):
    return (
        cfg.optim.batch_per_gpu,
        cfg.optim.grad_accum,
        cfg.effective_batch,
        cfg.optim.lr,
        cfg.optim.warmup_steps,
        cfg.schedule.checkpoint_every,
        cfg.deepspeed.zero_stage,
        cfg.deepspeed.reduce_bucket_size,
        cfg.distributed.collective_timeout_s,
    )


@pytest.mark.parametrize(
    "nodes, gpus, expected",
    [
        # 32 GPUs: target 128 x sqrt(2) = 181 -> 6 per GPU = 192; LR 1.5e-4; warmup between
        # 1500 (16) and 1200 (48) at log2 position 1/1.585 -> 1310.7 -> 1300; derived timeout 600 s;
        # accumulation 1: ZeRO-2; 4 nodes: the 11.3M gradient in buckets of 11.3M / 4 -> 3e6
        (4, 8, (6, 1, 192, 1.5e-4, 1300, 850, 2, 3_000_000, 600)),
        # 12 GPUs: 128 / (8 x 12) needs 2 accumulation steps, then 128 / 24 -> 5 per GPU = 120;
        # accumulating: ZeRO-1 (gradients reduced once per step)
        (3, 4, (5, 2, 120, 9.3e-5, 1700, 1400, 1, 3_000_000, 600)),
        # 2 GPUs on one node: 8 x 8 x 2 = 128; checkpoints 2000 x 2/8 = 500 steps (same hours as 8 GPUs);
        # one node: one bucket of 2e7 holds the whole gradient
        (1, 2, (8, 8, 128, 1e-4, 2000, 500, 1, 20_000_000, 600)),
        # 128 GPUs: 128 x sqrt(8) = 362 -> 3 per GPU = 384, LR 3e-4; past the 64-GPU anchors by
        # 1/sqrt(world ratio): warmup 1000/sqrt(2) = 707 -> 700, checkpoints 500/sqrt(2) -> 350;
        # timeout 600 + 30 x 6 nodes over 10 = 780 s
        (16, 8, (3, 1, 384, 3e-4, 700, 350, 2, 3_000_000, 780)),
    ],
)
def test_derive_for_unpublished_topologies(h100, nodes, gpus, expected):
    r = derive_run_config(h100, nodes, gpus)
    assert r.derived and r.preset == "8gpu-h100"
    c = r.config
    assert (c.topology.nodes, c.topology.gpus_per_node) == (nodes, gpus)
    assert values(c) == expected
    # every value the rules set has its reason, the one the review screen shows
    for key in (
        "optim.batch_per_gpu",
        "optim.grad_accum",
        "optim.lr",
        "optim.warmup_steps",
        "schedule.checkpoint_every",
        "deepspeed.zero_stage",
        "deepspeed.reduce_bucket_size",
        "deepspeed.allgather_bucket_size",
        "deepspeed.overlap_comm",
        "distributed.collective_timeout_s",
        "distributed.nccl_env",
    ):
        assert r.reason_for(key), key
    assert c.run.preset == f"8gpu-h100@{nodes}x{gpus}"
    # buckets: reduce = allgather; overlap only where there are several buckets (across nodes), and
    # not under bf16 ZeRO-1 (DeepSpeed's BF16_Optimizer reduces the whole gradient at the step)
    assert c.deepspeed.allgather_bucket_size == c.deepspeed.reduce_bucket_size
    assert c.deepspeed.overlap_comm is (nodes > 1 and c.deepspeed.zero_stage == 2)


def test_lr_reason_reads_like_the_review_screen(h100):
    r = derive_run_config(h100, 6, 8)
    assert (
        r.reason_for("optim.lr")
        == "LR 0.00018: 1e-4 x 240/128 = 0.0001875, rounded down to 2 significant digits"
    )
    why = r.reason_for("distributed.collective_timeout_s")
    assert why.startswith("600 s for 6 node(s)") and "published presets wait 10800 s" in why


@pytest.mark.parametrize("name", ["16gpu-h100", "48gpu-h100", "64gpu-h100", "8gpu-h100"])
def test_published_topologies_derive_back_to_published_values(h100, name):
    # the rules are fitted to the public presets: deriving their topology gives their values,
    # except the ZeRO stage, which derive sizes on purpose (ZeRO-1 when accumulating, else ZeRO-2:
    # ZeRO-3 buys nothing at 11.3M); the shipped buckets are sized by the same rule
    pub = load_preset(name, user_dir=None).config
    got = derive_run_config(h100, pub.topology.nodes, pub.topology.gpus_per_node).config
    assert values(got)[:6] == values(pub)[:6]
    assert values(got)[7] == values(pub)[7]
    assert got.deepspeed.overlap_comm == pub.deepspeed.overlap_comm
    # derived configs wait minutes, not the published hours: the console names a stall in ~30 s
    assert (
        got.distributed.collective_timeout_s
        == derived_collective_timeout_s(pub.topology.nodes)
        < pub.distributed.collective_timeout_s
    )
    assert got.deepspeed.zero_stage == (1 if pub.optim.grad_accum > 1 else 2)
    if pub.deepspeed.zero_stage == 3:
        d, p = got.deepspeed, pub.deepspeed
        assert (d.stage3_max_live_parameters, d.stage3_prefetch_bucket_size) == (
            p.stage3_max_live_parameters,
            p.stage3_prefetch_bucket_size,
        )
    assert got.distributed.nccl_env == pub.distributed.nccl_env


def test_memory_caps_the_per_gpu_batch(h100):
    # 24 GB cards: the memory estimate allows 3 clips of 12x480x720, so 8 GPUs need accumulation 6
    r = derive_run_config(h100, 1, 8, gpu_memory_gb=24)
    c = r.config
    assert c.optim.batch_per_gpu <= 3 and c.effective_batch >= 128 - 8 * 3
    assert c.topology.gpu_memory_gb == 24
    assert "memory allows" in r.reason_for("optim.batch_per_gpu")


def test_no_fit_at_all_is_a_clear_error(h100):
    with pytest.raises(DeriveError, match="one clip of 12x480x720 needs more than 2 GB"):
        derive_run_config(h100, 1, 8, gpu_memory_gb=2)


def test_tight_memory_turns_on_activation_checkpointing(h100):
    # 8 GB: one clip (~7.5 GB at its peak + ~1.1 GB fixed with right-sized buckets) fits only with
    # recomputation (~4.3 GB)
    r = derive_run_config(h100, 1, 8, gpu_memory_gb=8)
    assert r.config.model.activation_checkpointing
    assert r.reason_for("model.activation_checkpointing")


def test_user_preset_asking_for_zero3_keeps_it(tmp_path):
    (tmp_path / "mine.toml").write_text('[preset]\nbase = "8gpu-h100"\n[deepspeed]\nzero_stage = 3\n')
    base = load_preset("mine", user_dir=tmp_path)
    r = derive_run_config(base, 4, 8)
    assert r.config.deepspeed.zero_stage == 3 and "asks for it" in r.reason_for("deepspeed.zero_stage")


def test_overrides_win_over_rules(h100):
    r = derive_run_config(h100, 4, 8, overrides=["optim.lr=5e-4", "deepspeed.zero_stage=3"])
    assert r.config.optim.lr == 5e-4 and r.config.deepspeed.zero_stage == 3
    assert "--set" in [x for x in r.reasons if x.key == "optim.lr"][-1].reason


def test_rules_in_isolation():
    assert [collective_timeout_s(n) for n in (1, 2, 5, 6, 7, 8, 40)] == [
        3600,
        7200,
        7200,
        10800,
        10800,
        14400,
        14400,
    ]
    assert [derived_collective_timeout_s(n) for n in (1, 10, 11, 16, 40, 64)] == [
        600,
        600,
        630,
        780,
        1500,
        1800,
    ]
    assert [lr_for(b) for b in (128, 240, 256, 192)] == [1e-4, 1.8e-4, 2e-4, 1.5e-4]
    assert gpu_family("NVIDIA H100 80GB HBM3") == "H100" and gpu_family("NVIDIA A800-SXM4-80GB") == "A800"
    assert gpu_family("NVIDIA A100-SXM4-40GB") == "A800" and gpu_family("NVIDIA L40S") is None


def test_auto_picks_the_shipped_preset_for_its_topology():
    r = auto_select(2, 8, gpu_name="NVIDIA H100 80GB HBM3")
    assert not r.derived and r.preset == "16gpu-h100" and r.config == load_preset("16gpu-h100").config
    assert auto_select(1, 8, gpu_name="NVIDIA A800-SXM4-80GB").preset == "8gpu-a800"
    assert auto_select(1, 8, gpu_name="NVIDIA H100 PCIe").preset == "8gpu-h100"
    assert auto_select(1, 2, device="cpu").preset == "cpu-smoke"
    # GPU name not known: the H100 preset, the public reference hardware
    assert auto_select(1, 8).preset == "8gpu-h100"


def test_auto_uses_detected_memory_on_a_match():
    r = auto_select(1, 8, gpu_name="NVIDIA H100 NVL", gpu_memory_gb=94)
    assert r.preset == "8gpu-h100" and r.config.topology.gpu_memory_gb == 94
    assert r.reason_for("topology.gpu_memory_gb")


def test_auto_derives_and_says_from_which_base():
    r = auto_select(4, 8, gpu_name="NVIDIA H100 80GB HBM3")
    # 32 GPUs: 48 is closer than 16 in log2 world size (0.58 against 1.0)
    assert r.derived and r.preset == "48gpu-h100"
    assert "derived from 48gpu-h100" in r.reason_for("preset") and "4 x 8" in r.summary
    a100 = auto_select(2, 8, gpu_name="NVIDIA A100-SXM4-40GB", gpu_memory_gb=40)
    assert a100.derived and a100.preset == "8gpu-a800" and a100.config.topology.gpu_memory_gb == 40
    cpu = auto_select(2, 2, device="cpu")
    assert cpu.derived and cpu.preset == "cpu-smoke"
    assert cpu.config.topology.device == "cpu" and cpu.config.distributed.nccl_env == {}
    l40 = auto_select(1, 4, gpu_name="NVIDIA L40S", gpu_memory_gb=48)
    assert l40.preset == "8gpu-h100" and "no preset family" in l40.reason_for("preset")


def test_auto_prefers_a_user_preset_for_the_same_topology(tmp_path, monkeypatch):
    monkeypatch.setenv("TAEHV_CONSOLE_PRESETS", str(tmp_path))
    (tmp_path / "ours.toml").write_text(
        '[preset]\nbase = "16gpu-h100"\ngpu = "H100"\n[optim]\nmax_steps = 10\n'
    )
    r = auto_select(2, 8, gpu_name="H100", presets=list_presets().presets)
    assert r.preset == "ours" and r.config.optim.max_steps == 10
