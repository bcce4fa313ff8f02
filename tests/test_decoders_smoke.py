"""benchmarks/decoders.py runs in CI as an untimed smoke test: PyAV over real H.264 files, and the
plain statement that torchcodec is absent (it is not a dependency; docs/data-path.md has figures)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from trainer.synthetic import make_photo_clips

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "decoders.py"


def test_decoders_benchmark_reads_real_clips_and_says_what_it_measured(tmp_path):
    make_photo_clips(tmp_path / "clips", clips=2, frames=30, height=64, width=96)
    r = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "clips"), "--clips", "3", "--step", "2"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "12 frames 2 apart per clip, 3 clips each" in r.stdout
    assert re.search(r"== clips \(96x64\)\n  pyav +\d+\.\d{3} CPU-s, \d+\.\d{3} wall-s per clip", r.stdout), (
        r.stdout
    )
    # PyAV's own NVDEC is probed on the first clip: measured where there is one, else the reason
    nvdec = re.search(r"PyAV NVDEC: (yes|not here \((.+)\))\n", r.stdout)
    assert nvdec, r.stdout
    if nvdec[1] == "yes":
        assert re.search(r"  pyav-nvdec +\d+\.\d{3} CPU-s", r.stdout), r.stdout
        assert re.search(r"mean \|pyav-nvdec - pyav\| 0\.\d{3} of 255", r.stdout), r.stdout
    else:
        assert "pyav-nvdec" not in r.stdout and nvdec[2], r.stdout
    if importlib.util.find_spec("torchcodec") is None:
        assert "torchcodec does not import here (ModuleNotFoundError" in r.stdout
    if "torchcodec does not import here" not in r.stdout:  # it decodes the same pixels as PyAV
        assert "mean |torchcodec - PyAV| 0.000" in r.stdout, r.stdout
