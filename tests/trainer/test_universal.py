"""Resume at another world size through DeepSpeed's universal checkpoint, for real (CPU, gloo):
checkpoints are converted with the command the trainer and the console offer and resumed at the
other world size. The effective batch is kept (batch x grad_accum x world) and the data order is
global, so the resumed steps see the same samples: their LR, step and loss continue the original
run's, within float tolerance."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tomli_w

from tests.trainer.runs import base_config, events, run_to_end, write_run
from trainer import checkpoint as ckpt
from trainer.config import load_config
from trainer.train import lr_at

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def config_at(clip_dir, world: int, stage: int, max_steps: int) -> dict:
    # effective batch 2 at any world size (1 x 2 x 1 or 1 x 1 x 2); a constant LR after warmup, so
    # a resumed run that stops earlier has the original's LR at every step
    return base_config(
        clip_dir,
        topology={"gpus_per_node": world},
        optim={"max_steps": max_steps, "grad_accum": 2 // world, "warmup_steps": 2, "schedule": "constant"},
        deepspeed={"zero_stage": stage},
        schedule={"checkpoint_every": 4, "val_every": 100, "keep_checkpoints": 2},
    )


def convert(step_dir) -> None:
    argv = ckpt.universal_command(step_dir)
    argv[0] = sys.executable  # "python" in the offered command: the environment's interpreter
    done = subprocess.run(
        argv + ["--num_extract_workers", "1", "--num_merge_workers", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        env={"DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert ckpt.universal_problem(step_dir) is None


def step_events(run) -> dict[int, dict]:
    return {e["step"]: e for e in events(run, 0, "step")}


def resume_elsewhere(run, clip_dir, stage: int, source, world: int, max_steps: int, original: dict) -> None:
    """Convert `source`, resume it at `world` up to max_steps, and compare with the original run."""
    convert(source)
    (run / "run.toml").write_text(tomli_w.dumps(config_at(clip_dir, world, stage, max_steps)))
    launch = run_to_end(run, world, ("--resume", str(source)))
    assert f"loaded the universal checkpoint {source / 'universal'}" in launch.tail(300)
    start = events(run, 0, "start")[-1]
    first = ckpt.verify(source).step
    assert start["world_size"] == world and start["step"] == first and start["resumed_from"] == str(source)
    resumed = {s: e for s, e in step_events(run).items() if e["time"] > start["time"]}
    assert sorted(resumed) == list(range(first + 1, max_steps + 1))
    cfg = load_config(run / "run.toml")
    for s, e in resumed.items():
        assert e["lr"] == pytest.approx(lr_at(s - 1, cfg))
        assert e["lr"] == pytest.approx(original[s]["lr"])
        # the same weights, optimizer moments and samples: the original run's loss. Reductions in
        # another order differ in the last bits, and early Adam steps amplify that to ~1% after a
        # leg; a restart (or a lost optimizer state) is off by orders of magnitude this early on
        assert e["loss"] == pytest.approx(original[s]["loss"], rel=2e-2), (s, e, original[s])
    assert ckpt.verify(run / "checkpoints" / f"step-{max_steps}").world_size == world


@pytest.mark.parametrize("stage", [2, 3], ids=["zero2", "zero3"])
def test_resume_at_another_world_size_continues_the_run(tmp_path, clip_dir, stage):
    """2 processes to 8 steps (saving at 4); step-4 resumed at 1 process to step 6; that step-6
    resumed at 2 processes to step 8. Each leg continues the original 2-process run."""
    run = write_run(tmp_path / "run", config_at(clip_dir, 2, stage, 8))
    run_to_end(run, 2)
    original = step_events(run)
    assert sorted(original) == list(range(1, 9))
    resume_elsewhere(run, clip_dir, stage, run / "checkpoints" / "step-4", 1, 6, original)  # 2 -> 1
    resume_elsewhere(run, clip_dir, stage, run / "checkpoints" / "step-6", 2, 8, original)  # 1 -> 2
