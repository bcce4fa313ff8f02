"""The cpu-smoke preset visibly learns on real video: a real 2-process run as the console starts it,
on photo clips (a camera moving over real photographs, H.264). The last validation beats the PSNR
of a flat mid-grey output (what a decoder that learned only the mean scores) by 3 dB.

On the generated clips the console trains on by default, the README's first command itself
(`taehv-console --no-tui`, cpu-smoke as shipped) is the learning run: tests/e2e/test_headless.py
checks that its validation PSNR gains 3 dB over the run and ends above a flat output.
"""

from __future__ import annotations

import json

import pytest

from taehv_console.core.plan.presets import load_preset
from tests.trainer.runs import events, flat_grey_psnr, run_to_end, write_run
from trainer.config import config_from_dict
from trainer.synthetic import make_photo_clips

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_cpu_smoke_beats_a_flat_output_by_3_db_on_photo_clips(tmp_path):
    """cpu-smoke as shipped, on 12 photo clips made as the console generates its own clips."""
    cfg = load_preset("cpu-smoke", user_dir=None).config
    d = cfg.data
    make_photo_clips(
        tmp_path / "clips",
        clips=12,
        frames=d.frames * d.max_delta + 4,
        height=d.height,
        width=d.width,
        seed=0,
    )
    data = cfg.model_dump(mode="json")
    data["data"]["source"] = str(tmp_path / "clips")
    cfg = config_from_dict(data)
    run = write_run(tmp_path / "run", data)
    run_to_end(run, cfg.topology.world_size)
    vals = events(run, 0, "val")
    assert [v["step"] for v in vals] == [0, 10, 20, 30, 40]  # the untrained baseline first
    assert (
        not (run / "best" / "info.json").is_file()
        or json.loads((run / "best" / "info.json").read_text())["step"] > 0
    )
    flat = flat_grey_psnr(cfg)
    curve = [round(v["psnr"], 2) for v in vals]
    # Measured: [7.17, 11.51, 13.02, 14.23, 14.43] against 11.04 for flat grey.
    assert vals[-1]["psnr"] >= flat + 3.0, f"validation PSNR {curve} vs {flat:.2f} dB for a flat grey output"
