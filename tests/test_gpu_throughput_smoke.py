"""benchmarks/gpu_throughput.py runs in CI as an untimed smoke test on CPU at a tiny size, through
both the synthetic path and the trainer's real loader over real video files."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.synthetic import make_synthetic

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_throughput.py"


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_throughput", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_flop_count_and_mfu_follow_the_facts():
    b = _bench()
    assert b.flop_per_clip_step(12, 480, 720) == pytest.approx(6.1e12)
    assert b.flop_per_clip_step(12, 64, 64) == pytest.approx(6.1e12 * 64 * 64 / (480 * 720))
    # the arithmetic: ~65 clips/s per H100 at 40 % MFU
    assert 65 * b.flop_per_clip_step(12, 480, 720) / b.H100_BF16_PEAK == pytest.approx(0.40, abs=0.01)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tiny_cpu_run_goes_through_synthetic_and_loader(tmp_path):
    make_synthetic(tmp_path / "clips", clips=3, frames=8, height=64, width=80)
    r = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--tiny",
            "--modes",
            "synthetic,loader",
            "--data",
            str(tmp_path / "clips"),
            "--workers",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith(("synthetic", "loader"))]
    assert [(row[0], row[1]) for row in rows] == [
        ("synthetic", "full"),
        ("synthetic", "crop"),
        ("loader", "full"),
        ("loader", "crop"),
    ]
    assert all(float(row[4]) > 0 for row in rows)  # clips/s
    assert "not a measurement" in r.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tiny_cpu_run_times_the_teacher_online_against_cached_latents():
    r = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--tiny",
            "--no-bf16",
            "--modes",
            "teacher-online,teacher-cached",
            "--recipes",
            "full",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("teacher")]
    assert [row[0] for row in rows] == ["teacher-online", "teacher-cached"]
    assert all(float(row[4]) > 0 for row in rows)


def test_loader_mode_without_data_says_what_is_missing():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--modes", "loader"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0 and "--data DIR" in r.stderr
