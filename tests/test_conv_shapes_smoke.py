"""benchmarks/conv_shapes.py, CI's smoke run: the convolutions it finds are the model's (every
nn.Conv2d call of a forward, counted), at the full clip size on meta, and its CPU run times each
shape, with a padded figure for exactly the ones whose channels are not a multiple of 8."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "conv_shapes.py"


def _bench():
    spec = importlib.util.spec_from_file_location("conv_shapes", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_full_size_step_has_70_convolutions_and_two_with_3_channels():
    shapes = _bench().conv_shapes(12, 480, 720, batch=8)
    assert sum(shapes.values()) == 70
    # the image in (no gradient for its input) and the image out, both at full size
    threes = {(s[1], s[2], s[6], s[7], s[9]) for s in shapes if s[1] == 3 or s[2] == 3}
    assert threes == {(3, 64, 480, 720, False), (64, 3, 480, 720, True)}
    first = next(s for s in shapes if s[1] == 3)
    assert first[0] == 8 * 12  # every frame of the batch


def test_the_cpu_smoke_run_times_every_shape(tmp_path):
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert lines == [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    *shapes, summary = lines
    assert summary["calls"] == sum(s["calls"] for s in shapes) == 70
    assert summary["distinct"] == len(shapes)
    assert all(s["fwd_ms"] > 0 and s["ms_per_step"] > 0 for s in shapes)
    padded = sorted((s["in"], s["out"], s["padded_to"]) for s in shapes if "padded_to" in s)
    assert padded == [(3, 64, [8, 64]), (64, 3, [64, 8])]
