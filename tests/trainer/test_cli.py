"""`taehv-train` on bad input: clear errors before any process group, and make-synthetic."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import pytest

from tests.trainer.runs import base_config, write_run
from trainer.config import ConfigError, config_from_dict
from trainer.faults import FaultPlan, parse_faults
from trainer.train import lr_at


def _train(run, *args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "trainer.cli", "--run", str(run), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_missing_data_is_an_error_before_any_process_group(tmp_path):
    run = write_run(tmp_path / "run", base_config(tmp_path / "no-such-dir"))
    r = _train(run)
    assert r.returncode == 2
    assert "no-such-dir" in r.stderr
    assert not (run / "events").exists()  # nothing started


def test_empty_data_dir_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    run = write_run(tmp_path / "run", base_config(tmp_path / "empty"))
    r = _train(run)
    assert r.returncode == 2 and "empty" in r.stderr


def test_bad_run_toml_names_the_file_and_key(tmp_path, clip_dir):
    cfg = base_config(clip_dir)
    cfg["optim"]["batch_per_gpu"] = 0
    cfg["data"]["frames"] = 10
    cfg["deepspeed"]["bucket_size"] = 5
    run = write_run(tmp_path / "run", cfg)
    r = _train(run)
    assert r.returncode == 2
    for needle in (
        "run.toml",
        "optim.batch_per_gpu",
        "data.frames",
        "multiple of 4",
        "deepspeed.bucket_size",
        "unknown key",
    ):
        assert needle in r.stderr, needle


def test_config_errors_are_collected_not_first_only():
    with pytest.raises(ConfigError) as err:
        config_from_dict(
            {"optim": {"lr": -1, "betas": [0.9, 1.5]}, "data": {"max_delta": 1, "min_delta": 3}}, "x.toml"
        )
    text = str(err.value)
    assert "x.toml" in text and "optim.lr" in text and "optim.betas" in text and "max_delta" in text


def test_lr_schedule_warmup_then_cosine_to_the_floor():
    cfg = config_from_dict({"optim": {"lr": 1e-3, "warmup_steps": 10, "max_steps": 110, "min_lr_ratio": 0.1}})
    lrs = [lr_at(s, cfg) for s in range(110)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))  # monotone decay after warmup
    assert lr_at(10_000, cfg) == pytest.approx(1e-4)  # never below the floor


def test_fault_spec_parsing():
    assert [f.kind for f in parse_faults("nan:1:2, delay:0:*:0.5")] == ["nan", "delay"]
    with pytest.raises(ValueError, match="TAEHV_FAULTS"):
        parse_faults("explode:1:2")
    plan = FaultPlan(1, "nan:1:2")
    assert plan.nan_loss(2) and not plan.nan_loss(2)  # once: the retried micro-batch is clean
    assert not FaultPlan(0, "nan:1:2").nan_loss(2)


def test_make_synthetic_command(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.cli",
            "make-synthetic",
            str(tmp_path / "c"),
            "--clips",
            "2",
            "--frames",
            "8",
            "--size",
            "32x48",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "c").glob("*.mp4"))) == 2
    bad = subprocess.run(
        [sys.executable, "-m", "trainer.cli", "make-synthetic", str(tmp_path / "d"), "--size", "48"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "48" in bad.stderr
    photos = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.cli",
            "make-synthetic",
            str(tmp_path / "p"),
            "--photos",
            "--clips",
            "2",
            "--frames",
            "4",
            "--size",
            "32x48",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert photos.returncode == 0, photos.stderr
    assert len(list((tmp_path / "p").glob("photo-*"))) == 2


def _bench(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "trainer.cli", "bench-data", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bench_data_measures_real_clips_and_sizes_the_loader(clip_dir):
    r = _bench(
        clip_dir, "--frames", 8, "--size", "64x64", "--clips", 3, "--target-clips-per-s", 200, "--json"
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["clips"] == 3 and (out["frames"], out["height"], out["width"]) == (8, 64, 64)
    assert 0 < out["decode_cpu_s"] <= out["load_cpu_s"] and out["jitter_cpu_s"] > 0
    assert out["source"].endswith("64x80") and out["skipped"] == []
    assert out["workers_needed"] == max(1, math.ceil(200 * out["load_cpu_s"]))
    text = _bench(clip_dir, "--frames", 8, "--size", "64x64", "--clips", 2, "--workers", 1)
    assert text.returncode == 0, text.stderr
    assert "CPU-s per clip" in text.stdout and "H100 at 40% MFU" in text.stdout
    assert "data.num_workers = 1 gives" in text.stdout


def test_bench_data_bad_input_is_named(tmp_path, clip_dir):
    r = _bench(tmp_path / "nowhere", "--clips", 2)
    assert r.returncode == 2 and "nowhere" in r.stderr and "does not exist" in r.stderr
    r = _bench(clip_dir, "--size", "60x64")
    assert r.returncode == 2 and "multiple of 8" in r.stderr
    # sources smaller than the crop are never upsampled: every clip is skipped, and the error says why
    r = _bench(clip_dir, "--size", "480x720", "--clips", 1)
    assert r.returncode == 2 and "smaller than the 480x720 training crop" in r.stderr
