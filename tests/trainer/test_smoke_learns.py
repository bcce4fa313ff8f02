"""The cpu-smoke preset visibly learns: a real 2-process run, as the console starts it, on photo
clips (a camera moving over real photographs, H.264). Its last validation must beat the PSNR of a
flat mid-grey output (what an untrained decoder with the 0.5 output bias, or one that learned only
the mean, scores) by at least 3 dB."""

from __future__ import annotations

import pytest
import torch

from taehv_console.core.plan.presets import load_preset
from tests.trainer.runs import events, run_to_end, write_run
from trainer.config import config_from_dict
from trainer.data import VideoClipDataset, find_videos, split_train_val, validation_items
from trainer.metrics import psnr_from_mse
from trainer.synthetic import make_photo_clips

pytestmark = [
    pytest.mark.slow, pytest.mark.timeout(900),
    # Measured in a clean-clone CI run: [8.27, 13.2, 12.83, 13.26] dB against 13.90 for flat grey.
    # The new init learns photo clips in a one-process benchmark (benchmarks/init_psnr.py), but the
    # cpu-smoke recipe (2 ranks, batch 1 x accum 2, LR 1e-3) does not yet: kept visible, issue 11.
    pytest.mark.xfail(strict=True, reason="cpu-smoke does not yet gain 3 dB over a flat output in 40 steps"),
]


def _flat_grey_psnr(cfg) -> float:
    _train, val = split_train_val(find_videos(cfg.data.source), cfg.data.val_fraction, cfg.data.val_max_clips)
    ds = VideoClipDataset(val, cfg.data, train=False)
    psnrs = []
    for index, seed, _counts in validation_items(len(ds), 0, 1):
        x = ds[(index, seed)]["video"].float() / 255
        psnrs.append(psnr_from_mse(torch.mean((x - 0.5) ** 2).item()))
    return sum(psnrs) / len(psnrs)


def test_cpu_smoke_beats_a_flat_output_by_3_db_on_photo_clips(tmp_path):
    cfg = load_preset("cpu-smoke", user_dir=None).config
    d = cfg.data
    make_photo_clips(tmp_path / "clips", clips=12, frames=d.frames * d.max_delta + 4, height=d.height,
                     width=d.width, seed=0)  # fmt: skip
    data = cfg.model_dump(mode="json")
    data["data"]["source"] = str(tmp_path / "clips")
    cfg = config_from_dict(data)
    run = write_run(tmp_path / "run", data)
    run_to_end(run, cfg.topology.world_size)
    vals = events(run, 0, "val")
    assert [v["step"] for v in vals] == [10, 20, 30, 40]
    flat = _flat_grey_psnr(cfg)
    curve = [round(v["psnr"], 2) for v in vals]
    assert vals[-1]["psnr"] >= flat + 3.0, f"validation PSNR {curve} vs {flat:.2f} dB for a flat grey output"
