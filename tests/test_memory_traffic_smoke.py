"""benchmarks/memory_traffic.py counts bytes and FLOPs per training clip-step on the meta device (no
compute, so CI runs it at full size): its counter counts what an operator moves, and the model as it
runs moves fewer bytes than the published order in both layouts."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "memory_traffic.py"


def _bench():
    spec = importlib.util.spec_from_file_location("memory_traffic", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_counter_counts_reads_and_writes_and_not_views():
    b = _bench()
    x = torch.empty(10, 4, device="meta")  # 160 bytes
    with b.TrafficCounter() as c:
        x.relu_()  # reads and writes x
        x.t().unsqueeze(0)[..., ::2].view(-1, 2, 5)  # views move nothing
        torch.empty(10, 4, device="meta").copy_(x)  # writes the destination, never reads it
        torch.empty(3, device="meta").expand(5, 3) + 1  # an expanded input is read once
    assert {n: (v.calls, v.read, v.written) for n, v in c.ops.items()} == {
        "relu_": (1, 160, 160),
        "copy_": (1, 160, 160),
        "add": (1, 12, 60),
    }
    assert c.total == 160 * 4 + 72 and c.by_group() == {"elementwise/other": 392, "copies/cat": 320}


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_small_clip_counts_are_positive_and_the_model_moves_less_than_the_published_order(channels_last):
    b = _bench()
    ours, flops = b.count(4, 32, 48, channels_last)
    published, published_flops = b.count(4, 32, 48, channels_last, baseline=True)
    groups = ours.by_group()
    assert all(groups[g] > 0 for g in ("conv", "elementwise/other", "copies/cat", "upsample"))
    assert 0 < ours.total < published.total
    assert 0 < flops < published_flops  # TGrow before Upsample: a quarter of its pixels
    assert published.ops["zeros_like"].calls == 18 and "zeros_like" not in ours.ops  # MemBlocks' pasts


def test_full_clip_step_figures_as_documented():
    """docs/performance.md quotes these (12x480x720, bf16, batch 1)."""
    b = _bench()
    gb = {
        (cl, base): b.count(12, 480, 720, cl, base)[0].total / 1e9
        for cl in (False, True)
        for base in (False, True)
    }
    assert gb[False, True] == pytest.approx(46.56, abs=0.01)  # the published order, NCHW
    assert gb[False, False] <= 41.5  # the target: at least 5 GB less
    assert gb[True, False] < gb[True, True] - 9  # channels_last: one permuted copy, not two


def test_script_prints_a_table_and_a_json_line_per_layout():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--size", "32x48", "--frames", "4"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [line["layout"] for line in lines] == ["NCHW", "channels_last"]
    assert all(line["bytes"] > 0 and line["tflop"] > 0 and line["batch"] == 1 for line in lines)
    assert "== eager NCHW, 4x32x48" in r.stdout and "[conv]" in r.stdout
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "--size", "30x48"], capture_output=True, text=True, timeout=300
    )
    assert bad.returncode != 0 and "--size 30x48" in bad.stderr
