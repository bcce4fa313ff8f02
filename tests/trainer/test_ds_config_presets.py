"""The GPU presets' execution settings train for real: 16gpu-h100's model and DeepSpeed sections
as shipped (channels_last, torch.compile, the published ZeRO-3 and its stage-3 values, 3e6-element
buckets with overlap, bf16) in a 2-process CPU run (accelerate, gloo) at a tiny clip size, and the
engine runs them (deepspeed.effective.json), with DeepSpeed's module hooks run eagerly between the
compiled pieces. compile under ZeRO-2 is tests/trainer/test_speed_options.py's."""

from __future__ import annotations

import json
import math
import re

import pytest

from taehv_console.core.plan.presets import load_preset
from tests.trainer.runs import BF16_CROP, base_config, events, run_to_end, write_run
from trainer.config import load_config
from trainer.ds_config import build_deepspeed_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_zero3_preset_with_compile_and_channels_last_trains(tmp_path, clip_dir, monkeypatch):
    monkeypatch.setenv("TAEHV_CONSOLE_PRESETS", str(tmp_path / "none"))
    shipped = load_preset("16gpu-h100").config
    assert shipped.model.compile and shipped.model.channels_last and shipped.deepspeed.zero_stage == 3
    cfg = base_config(
        clip_dir,
        model=shipped.model.model_dump(mode="json"),
        deepspeed=shipped.deepspeed.model_dump(mode="json"),
        data=BF16_CROP,
        optim={"grad_accum": 1, "max_steps": 3, "warmup_steps": 0, "lr": 2e-4},
        schedule={"val_every": 100, "checkpoint_every": 100},
    )
    run = write_run(tmp_path / "run", cfg)
    log = run_to_end(run, 2).log.read_text(errors="replace")
    # DeepSpeed's hooks inside the compiled stages run eagerly: Dynamo no longer compiles them again
    # for every module type until its recompile limit, which it said in every rank's log
    assert re.search(r"DeepSpeed's \d+ module hooks run eagerly", log), log[-3000:]
    assert "recompile_limit" not in log, log[-3000:]
    steps = events(run, 0, "step")
    assert [e["step"] for e in steps] == [1, 2, 3]
    assert all(math.isfinite(e["loss"]) for e in steps) and steps[-1]["loss"] < steps[0]["loss"]
    got = json.loads((run / "deepspeed.effective.json").read_text())
    asked = build_deepspeed_config(load_config(run / "run.toml"), "cpu")
    assert got["zero_optimization"] == asked["zero_optimization"]
    z = got["zero_optimization"]
    assert (z["stage"], z["reduce_bucket_size"], z["overlap_comm"]) == (3, 3_000_000, True)
    assert got["bf16"]["enabled"]
