"""benchmarks/host_syncs.py counts the host reads of device values in the trainer's real train_step
(one process, DeepSpeed on CPU). The GPU presets' loop must read nothing between a micro-batch's
forward and its backward, and at most one value per optimizer step outside log steps (the stop
flag, one step late); DeepSpeed's own reads are counted apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "host_syncs.py"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_gpu_loop_reads_at_most_one_device_value_per_step_and_none_before_backward():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "2", "--grad-accum", "2"],
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    figures = json.loads(r.stdout.strip().splitlines()[-1])
    assert figures["between_forward_and_backward"] == 0
    assert figures["trainer_per_step"] <= 1
    assert "item at runtime.py" in r.stdout  # the one read: the stop flag, reduced in the background
    assert figures["deepspeed_per_step"] > 0  # DeepSpeed's own reads are seen, and counted apart
