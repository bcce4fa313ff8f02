"""core/plan never imports a UI library or torch: the TUI, the headless front end and `plan`
on a laptop all use it, and the planner's figures need no framework."""

from __future__ import annotations

import subprocess
import sys

import pytest

MODULES = [
    "taehv_console.core.plan.footprint",
    "taehv_console.core.plan.planner",
    "taehv_console.core.plan.presets",
    "taehv_console.core.plan.derive",
    "taehv_console.core.plan.render",
]


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_no_ui_and_no_torch(module):
    code = (
        f"import importlib, sys; importlib.import_module({module!r}); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'rich', 'textual', 'torch', 'deepspeed', 'accelerate'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
