"""ZeRO-1, the stage the planner picks when gradients are accumulated (core/plan/zero.py): real
2-process DeepSpeed runs of the trainer (accelerate, gloo) with the sized buckets. ZeRO-1 trains,
checkpoints and gives ZeRO-2's losses (the same gradients, reduced once per step instead of after
every micro-batch), and the engine runs what trainer/ds_config.py wrote (deepspeed.effective.json)."""

from __future__ import annotations

import json

import pytest

from taehv_console.core.plan.communication import link_for
from taehv_console.core.plan.zero import size_zero_for
from tests.trainer.runs import BF16_CROP, base_config, events, run_to_end, write_run
from trainer import checkpoint as ckpt
from trainer.config import config_from_dict, load_config
from trainer.ds_config import build_deepspeed_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _sized_run(
    tmp_path_factory, clip_dir, name: str, stage: int | None = None, precision: str = "no", env=None
):
    # 1 node x 2 CPU processes, accumulation 2
    cfg = base_config(clip_dir, deepspeed={"mixed_precision": precision})
    if precision == "bf16":
        cfg["data"].update(BF16_CROP)
    bps, link, _ = link_for(1, "cpu")
    sized = size_zero_for(config_from_dict(cfg), bps, link)
    cfg["deepspeed"] = {
        "mixed_precision": precision,
        "zero_stage": sized.stage if stage is None else stage,
        "reduce_bucket_size": sized.bucket,
        "allgather_bucket_size": sized.bucket,
        "overlap_comm": sized.overlap,
    }
    run = write_run(tmp_path_factory.mktemp(name) / "run", cfg)
    run_to_end(run, 2, env=env)
    return sized, run


@pytest.fixture(scope="module")
def zero1(tmp_path_factory, clip_dir):
    return _sized_run(tmp_path_factory, clip_dir, "zero1")


def test_accumulation_on_one_node_sizes_zero1_with_one_bucket(zero1):
    sized, _ = zero1
    assert (sized.stage, sized.bucket, sized.overlap) == (1, 20_000_000, False)


def test_zero1_trains_checkpoints_and_runs_what_was_written(zero1):
    _, run = zero1
    steps = events(run, 0, "step")
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    assert min(e["loss"] for e in steps[-2:]) < steps[0]["loss"], [round(e["loss"], 5) for e in steps]
    assert events(run, 1, "start")[0]["zero_stage"] == 1
    assert events(run, 0, "stop")[-1]["reason"] == "done"
    scan = ckpt.scan(run / "checkpoints")
    assert [s.step for s in scan.complete] == [6, 3] and not scan.skipped
    # the engine's own parsed config: the stage, one 2e7 bucket and overlap off, as written
    asked = build_deepspeed_config(load_config(run / "run.toml"), "cpu")
    got = json.loads((run / "deepspeed.effective.json").read_text())
    assert got["zero_optimization"] == asked["zero_optimization"]
    z = got["zero_optimization"]
    assert (z["stage"], z["reduce_bucket_size"], z["allgather_bucket_size"], z["overlap_comm"]) == (
        1,
        20_000_000,
        20_000_000,
        False,
    )
    assert got["gradient_accumulation_steps"] == 2


def test_zero1_gives_zero2s_losses(tmp_path_factory, clip_dir, zero1):
    _, run1 = zero1
    _, run2 = _sized_run(tmp_path_factory, clip_dir, "zero2", stage=2)
    loss1 = [e["loss"] for e in events(run1, 0, "step")]
    loss2 = [e["loss"] for e in events(run2, 0, "step")]
    # the same data, init and updates; only where the micro-batch gradients are summed differs
    # (locally then reduced, or reduced then summed): rounding. base_config's LR 2e-3 without
    # warmup throws step 2's loss up ~25-100x, which amplifies that rounding in the later steps
    # (seen at 64x64: equal to 1e-6 up to step 3, 2.6e-3 apart at step 5; at 32x32: 5e-8 at step 2,
    # 1.1e-5 at step 3). A gradient summed wrongly (not averaged, or counted twice) is off by ~2x.
    assert loss1[:2] == pytest.approx(loss2[:2], rel=1e-6), (loss1, loss2)
    assert loss1[:3] == pytest.approx(loss2[:3], rel=1e-4), (loss1, loss2)
    assert loss1 == pytest.approx(loss2, rel=1e-2), (loss1, loss2)
    assert loss1[-1] != loss1[0]


def test_bf16_zero1_runs_as_deepspeeds_bf16_optimizer_and_trains(tmp_path_factory, clip_dir):
    # what a GPU preset's ZeRO-1 gets: bf16 weights with fp32 gradient accumulation, which DeepSpeed
    # runs as its BF16_Optimizer (trainer/ds_config.zero1_runs_bf16_optimizer), not the bucketed ZeRO.
    # Rank 1's loss is NaN at step 2: BF16_Optimizer's non-finite norm check skips that update on
    # every rank (ds_config.deepspeed_skips_nonfinite_step), the weights stay finite
    from safetensors.torch import load_file

    sized, run = _sized_run(
        tmp_path_factory, clip_dir, "zero1bf16", precision="bf16", env={"TAEHV_FAULTS": "nan:1:2"}
    )
    assert (sized.stage, sized.overlap) == (1, False) and "BF16_Optimizer" in sized.overlap_why
    assert events(run, 0, "start")[0]["nonfinite_guard"] == "deepspeed-step"
    steps = events(run, 0, "step")
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    assert [e["nonfinite_skipped"] for e in steps] == [0, 0, 1, 1, 1, 1]
    assert min(e["loss"] for e in steps[-2:]) < steps[0]["loss"], [round(e["loss"], 5) for e in steps]
    weights = load_file(str(run / "final" / "taehv.safetensors"))
    assert all(bool(w.isfinite().all()) for w in weights.values())
    assert events(run, 0, "stop")[-1]["reason"] == "done"
    scan = ckpt.scan(run / "checkpoints")
    assert [s.step for s in scan.complete] == [6, 3] and not scan.skipped
    got = json.loads((run / "deepspeed.effective.json").read_text())
    asked = build_deepspeed_config(load_config(run / "run.toml"), "cpu")
    assert got["zero_optimization"] == asked["zero_optimization"] and got["zero_optimization"]["stage"] == 1
    assert got["bf16"]["enabled"] and got["data_types"] == {"grad_accum_dtype": "fp32"}
