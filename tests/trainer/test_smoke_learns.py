"""The cpu-smoke preset visibly learns: a real 2-process run on generated clips, as the console
starts it, gains at least 3 dB of validation PSNR between its first and its last validation."""

from __future__ import annotations

import pytest

from taehv_console.core.plan.presets import load_preset
from tests.trainer.runs import events, run_to_end, write_run
from trainer.synthetic import make_synthetic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_cpu_smoke_gains_3_db_on_generated_clips(tmp_path):
    cfg = load_preset("cpu-smoke", user_dir=None).config
    d = cfg.data
    # the clips the console generates for cpu-smoke when no data is given (headless.py)
    make_synthetic(tmp_path / "clips", clips=12, frames=d.frames * d.max_delta + 4, height=d.height,
                   width=d.width, seed=0)  # fmt: skip
    data = cfg.model_dump(mode="json")
    data["data"]["source"] = str(tmp_path / "clips")
    run = write_run(tmp_path / "run", data)
    run_to_end(run, cfg.topology.world_size)
    vals = events(run, 0, "val")
    assert [v["step"] for v in vals] == [10, 20, 30, 40]
    gain = vals[-1]["psnr"] - vals[0]["psnr"]
    assert gain >= 3.0, f"validation PSNR {[round(v['psnr'], 2) for v in vals]}: gained only {gain:.2f} dB"
