"""The planner's checkpoint figures: what a failure costs at a preset's interval, and the interval
Young/Daly gives, checked against hand-computed values and through `plan` on the command line."""

from __future__ import annotations

import json
import math

import pytest

from taehv_console.cli import main
from taehv_console.core.plan.planner import (
    CHECKPOINT_FIXED_S,
    LLAMA3_FAILURES_PER_GPU_HOUR,
    RESTART_S,
    STORAGE_BYTES_PER_S,
    checkpoint_bytes,
    checkpoint_interval_s,
    checkpoint_overhead_s,
    checkpoint_save_s,
    cluster_mtbf_s,
    expected_failures,
    loss_per_failure_s,
    make_plan,
    round_steps,
    young_daly_interval_s,
)
from taehv_console.core.plan.presets import load_preset

PARAMS = 11_315_539  # TAEHV's published parameter count


@pytest.fixture(autouse=True)
def no_user_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TAEHV_CONSOLE_PRESETS", str(tmp_path / "none"))


def test_young_daly_by_hand():
    # save 60 s, MTBF 100 h: sqrt(2 x 60 x 360,000) = sqrt(43,200,000) = 6,572.67 s
    assert young_daly_interval_s(60, 100 * 3600) == pytest.approx(6572.67, abs=0.01)
    assert young_daly_interval_s(60, 100 * 3600) == pytest.approx(math.sqrt(2 * 60 * 360_000))


def test_young_daly_minimises_the_overhead_it_is_derived_from():
    run, save, mtbf = 100 * 3600.0, 60.0, 100 * 3600.0
    best = young_daly_interval_s(save, mtbf)
    at_best = checkpoint_overhead_s(run, best, save, mtbf, restart_s=0)
    # by hand: (run / tau) x save + (run / MTBF) x tau / 2 = 2 x 3285.8 s at the optimum
    assert at_best == pytest.approx(2 * run / best * save)
    for other in (best / 2, best * 0.9, best * 1.1, best * 2):
        assert checkpoint_overhead_s(run, other, save, mtbf, restart_s=0) > at_best


def test_llama3_default_rate():
    # 419 unexpected interruptions in 54 days on 16,384 H100 GPUs
    assert LLAMA3_FAILURES_PER_GPU_HOUR == pytest.approx(419 / (54 * 24 * 16384))
    assert LLAMA3_FAILURES_PER_GPU_HOUR == pytest.approx(1.97e-5, rel=0.01)
    # the whole Llama 3 cluster: one failure every ~3.1 h, as the report says ("about every 3 hours")
    assert cluster_mtbf_s(LLAMA3_FAILURES_PER_GPU_HOUR, 16384) / 3600 == pytest.approx(54 * 24 / 419)


def test_mtbf_loss_and_failures_by_hand():
    # 1e-4 per GPU-hour on 10 GPUs: one failure per 1,000 h
    assert cluster_mtbf_s(1e-4, 10) == pytest.approx(3.6e6)
    assert expected_failures(100 * 3600, 3.6e6) == pytest.approx(0.1)
    # an 8,000 s interval loses 4,000 s of work on average, plus the restart
    assert loss_per_failure_s(8000, restart_s=120) == 4120
    assert loss_per_failure_s(8000) == 4000 + RESTART_S
    assert checkpoint_interval_s(2000, 4.0) == 8000
    with pytest.raises(ValueError):
        cluster_mtbf_s(0, 8)


def test_checkpoint_bytes_and_save_by_hand():
    # bf16, ZeRO-2, EMA: 2 (weights) + 12 (fp32 master, exp_avg, exp_avg_sq) + 4 (weights.safetensors)
    # + 4 (EMA state) + 4 (EMA weights) = 26 bytes per parameter, whatever the world size
    parts = checkpoint_bytes(PARAMS, 2, 8, "bf16", ema=True)
    assert sum(parts.values()) == 26 * PARAMS
    assert sum(checkpoint_bytes(PARAMS, 3, 64, "bf16", ema=True).values()) == 26 * PARAMS
    assert sum(checkpoint_bytes(PARAMS, 2, 8, "bf16", ema=False).values()) == 18 * PARAMS
    # stage 0 keeps a whole EMA copy on every rank
    assert checkpoint_bytes(PARAMS, 0, 8, "bf16", ema=True)["ema_state"] == 8 * 4 * PARAMS
    # written and read back at 1 GB/s, + the fixed 10 s
    assert checkpoint_save_s(1e9, bytes_per_s=1e9, fixed_s=10, passes=2) == 12
    assert checkpoint_save_s(26 * PARAMS) == pytest.approx(
        2 * 26 * PARAMS / STORAGE_BYTES_PER_S + CHECKPOINT_FIXED_S
    )


def test_round_steps():
    assert [round_steps(x, 100_000) for x in (0.2, 1.4, 37.4, 123, 5425, 7670.2)] == [
        1,
        1,
        37,
        120,
        5400,
        7700,
    ]
    assert round_steps(5e6, 100_000) == 100_000  # never past the run


def test_8gpu_h100_interval_is_checkpoint_every_times_step_time():
    cfg = load_preset("8gpu-h100", user_dir=None).config
    plan = make_plan(cfg, gpu="H100")
    c = plan.checkpoint
    assert c is not None
    assert c.interval_s == pytest.approx(cfg.schedule.checkpoint_every * plan.time.step_s)
    # 2,000 x ~0.49 s (128 clips at 33 clips/s on each of 8 H100s, the trainer as measured)
    assert c.interval_s / 3600 == pytest.approx(0.27, abs=0.01)
    assert c.gpus == 8 and c.mtbf_s / 3600 == pytest.approx(1 / (LLAMA3_FAILURES_PER_GPU_HOUR * 8))
    assert c.run_s == pytest.approx(plan.time.hours_to_max_steps * 3600)
    assert c.expected_failures == pytest.approx(
        plan.time.hours_to_max_steps * 8 * LLAMA3_FAILURES_PER_GPU_HOUR
    )
    assert c.loss_per_failure_s == pytest.approx(c.interval_s / 2 + RESTART_S)
    assert c.gpu_hours(c.loss_per_failure_s) == pytest.approx(8 * (c.interval_s / 2 + RESTART_S) / 3600)
    assert c.expected_loss_s == pytest.approx(c.expected_failures * c.loss_per_failure_s)
    assert c.young_daly_s == pytest.approx(math.sqrt(2 * c.save_s * c.mtbf_s))
    assert c.recommended_steps == round_steps(c.young_daly_s / plan.time.step_s, cfg.optim.max_steps)
    assert c.saved_s >= 0  # at (near) the optimum, never worse than the preset's interval


def test_plan_json_carries_checkpointing_and_failure_rate_moves_the_recommendation(capsys):
    def checkpointing(*extra):
        code = main(["plan", "--preset", "8gpu-h100", "--json", *extra])
        data = json.loads(capsys.readouterr().out)
        assert code == 0
        return data["plan"]["checkpointing"]

    default = checkpointing()
    assert default["every_steps"] == 2000
    assert default["failures"]["per_gpu_hour"] == pytest.approx(LLAMA3_FAILURES_PER_GPU_HOUR)
    assert "Llama 3" in default["failures"]["source"]
    assert default["save"]["estimate"] is True and default["save"]["bytes"] == 26 * PARAMS
    assert {"loss_per_failure", "expected_loss", "young_daly"} <= set(default)

    # more failures: a shorter interval; fewer failures: a longer one
    often = checkpointing("--failure-rate", "1e-3")
    rarely = checkpointing("--failure-rate", "1e-6")
    assert often["failures"]["per_gpu_hour"] == 1e-3 and often["failures"]["source"] == "given"
    assert often["young_daly"]["every_steps"] < default["young_daly"]["every_steps"]
    assert rarely["young_daly"]["every_steps"] > default["young_daly"]["every_steps"]
    assert often["expected_loss"]["gpu_hours"] > default["expected_loss"]["gpu_hours"]
    # the interval the preset runs at does not depend on the failure rate
    assert often["interval_s"] == default["interval_s"]


def test_plan_comparison_json_has_checkpointing_for_every_preset(capsys):
    code = main(["plan", "--json", "--failure-rate", "2e-5"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    for p in data["plans"]:
        assert p["checkpointing"]["failures"]["per_gpu_hour"] == 2e-5
        assert p["checkpointing"]["failures"]["gpus"] == p["topology"]["world_size"]
        # the existing keys are still there
        assert {"time", "memory", "communication", "teacher"} <= set(p)


def test_plan_text_names_the_source(capsys):
    assert main(["plan", "--preset", "64gpu-h100"]) == 0
    out = capsys.readouterr().out
    assert "checkpoints" in out and "Young/Daly" in out
    assert "Llama 3" in out and "arXiv:2407.21783" in out and "419 unexpected interruptions" in out
    assert "every 500 steps" in out

    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "Checkpoints and failures" in out and "Llama 3" in out
    for name in ("8gpu-h100", "16gpu-h100", "48gpu-h100", "64gpu-h100"):
        assert out.count(name) >= 2  # in the time table and in the checkpoint table


@pytest.mark.parametrize("rate", ["0", "-1e-5", "2", "nan"])
def test_a_failure_rate_out_of_range_is_one_message(rate, capsys):
    try:
        code = main(["plan", "--preset", "8gpu-h100", f"--failure-rate={rate}"])
    except SystemExit as exc:  # argparse's type check (commands/options.py), a usage error
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert "--failure-rate" in err and "Traceback" not in err
