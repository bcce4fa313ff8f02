"""EMA and exported weights come from DeepSpeed's fp32 master weights, not the module's copies:
real 2-rank DeepSpeed runs (torchrun, gloo) under bf16 where the two differ, ZeRO-2 and ZeRO-3."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.trainer.runs import BIN, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROBE = Path(__file__).with_name("master_probe.py")
ROOT = Path(__file__).resolve().parents[2]


def _probe(stage: int, precision: str) -> list[dict]:
    cmd = [
        str(BIN / "torchrun"),
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(PROBE),
        str(stage),
        precision,
    ]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=500, cwd=ROOT)
    # both ranks print to one pipe: a rank's line may land right after the other's text, before its
    # newline, so each report is decoded from its marker on rather than line by line
    decoder = json.JSONDecoder()
    lines = [decoder.raw_decode(chunk)[0] for chunk in r.stdout.split("PROBE ")[1:]]
    assert r.returncode == 0 and len(lines) == 2, (
        f"probe failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )
    return sorted(lines, key=lambda d: d["rank"])


@pytest.mark.parametrize("stage", [2, 3])
def test_ema_and_export_read_the_fp32_master_under_bf16(stage):
    for got in _probe(stage, "bf16"):
        assert got["module_dtypes"] == ["torch.bfloat16"]  # the module holds bf16 copies ...
        assert got["masters_are_the_optimizers"]  # ... EMA reads the optimizer's own fp32 tensors
        assert got["master_dtypes"] == got["ema_dtypes"] == got["full_dtypes"] == ["torch.float32"]
        assert got["ema_moved"] and got["ema_differs"] and got["restored_after_ema"]
        assert got["full_shapes_ok"]
        if stage == 2:
            assert got["export_beats_module_precision"]  # exported values are not bf16-rounded
            assert got["partition_in_export"]


def test_fp32_zero2_reads_the_same_master_path():
    for got in _probe(2, "fp32"):
        assert got["masters_are_the_optimizers"] and got["full_dtypes"] == ["torch.float32"]
        assert got["ema_moved"] and got["restored_after_ema"] and got["partition_in_export"]
