"""`taehv-console --help` stays light: no torch, DeepSpeed or accelerate (seconds of import time,
and a CUDA initialisation on GPU machines) just to print help."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "deepspeed", "accelerate", "transformers", "textual")

PROBE = """
import json, sys
from taehv_console.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("MODULES " + json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {heavy})))
"""


def loaded_after(*argv: str) -> list[str]:
    # a fresh interpreter: this test process has long imported everything
    code = PROBE.replace("{heavy}", repr(set(HEAVY)))
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], check=False, capture_output=True, text=True, timeout=120
    )
    line = next(l for l in proc.stdout.splitlines() if l.startswith("MODULES "))
    return json.loads(line[len("MODULES ") :])


def test_top_level_help_imports_nothing_heavy():
    assert loaded_after("--help") == []


@pytest.mark.parametrize("command", ["presets", "plan", "render"])
def test_subcommand_help_imports_nothing_heavy(command):
    assert loaded_after(command, "--help") == []


def test_the_probe_would_notice_torch():
    # guard against a probe that can never fail: importing torch in the same way is seen
    code = PROBE.replace("{heavy}", repr(set(HEAVY))).replace(
        "from taehv_console.cli import main", "import torch\nfrom taehv_console.cli import main"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "--help"], check=False, capture_output=True, text=True, timeout=120
    )
    assert "torch" in proc.stdout
