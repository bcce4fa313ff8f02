"""`taehv-train` on bad input: clear errors before any process group, and make-synthetic."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.trainer.runs import base_config, write_run
from trainer.config import ConfigError, config_from_dict
from trainer.faults import FaultPlan, parse_faults
from trainer.train import lr_at


def _train(run, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "trainer.cli", "--run", str(run), *args],
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


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
    for needle in ("run.toml", "optim.batch_per_gpu", "data.frames", "multiple of 4", "deepspeed.bucket_size",
                   "unknown key"):  # fmt: skip
        assert needle in r.stderr, needle


def test_config_errors_are_collected_not_first_only():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"optim": {"lr": -1, "betas": [0.9, 1.5]}, "data": {"max_delta": 1, "min_delta": 3}}, "x.toml")
    text = str(err.value)
    assert "x.toml" in text and "optim.lr" in text and "optim.betas" in text and "max_delta" in text


def test_lr_schedule_warmup_then_cosine_to_the_floor():
    cfg = config_from_dict({"optim": {"lr": 1e-3, "warmup_steps": 10, "max_steps": 110, "min_lr_ratio": 0.1}})
    lrs = [lr_at(s, cfg) for s in range(110)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # monotone decay after warmup
    assert lr_at(10_000, cfg) == pytest.approx(1e-4)  # never below the floor


def test_fault_spec_parsing():
    assert [f.kind for f in parse_faults("nan:1:2, delay:0:*:0.5")] == ["nan", "delay"]
    with pytest.raises(ValueError, match="TAEHV_FAULTS"):
        parse_faults("explode:1:2")
    plan = FaultPlan(1, "nan:1:2")
    assert plan.nan_loss(2) and not plan.nan_loss(2)  # once: the retried micro-batch is clean
    assert not FaultPlan(0, "nan:1:2").nan_loss(2)


def test_make_synthetic_command(tmp_path):
    r = subprocess.run([sys.executable, "-m", "trainer.cli", "make-synthetic", str(tmp_path / "c"), "--clips", "2",
                        "--frames", "8", "--size", "32x48"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "c").glob("*.mp4"))) == 2
    bad = subprocess.run([sys.executable, "-m", "trainer.cli", "make-synthetic", str(tmp_path / "d"),
                          "--size", "48"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "48" in bad.stderr
    photos = subprocess.run([sys.executable, "-m", "trainer.cli", "make-synthetic", str(tmp_path / "p"), "--photos",
                             "--clips", "2", "--frames", "4", "--size", "32x48"],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert photos.returncode == 0, photos.stderr
    assert len(list((tmp_path / "p").glob("photo-*"))) == 2
