"""The import contracts in pyproject.toml ([tool.importlinter]) hold: core never imports the front
ends, trainer never imports taehv_console, nothing below ui imports ui, and no sibling modules
import each other in a cycle. Run here so `make test` and CI fail on a violation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = 4


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "lint-imports"
    assert exe.exists(), f"{exe} missing: install the test extras (pip install -e '.[test]')"
    # the tree under `root` first on the path: a copy is checked, not the installed package
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(exe), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_import_contracts_hold():
    r = lint_imports(ROOT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert f"Contracts: {CONTRACTS} kept, 0 broken." in r.stdout


def test_a_cycle_or_a_core_module_importing_the_ui_breaks_them(tmp_path):
    # the same tree with two violations added: lint-imports must say so and fail
    for name in ("taehv_console", "trainer"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "taehv_console/core/models.py", "a") as f:
        f.write("\n\ndef _violation():\n    import taehv_console.ui.app  # noqa: F401\n")
    with open(tmp_path / "taehv_console/core/plan/planner.py", "a") as f:
        f.write("\n\ndef _cycle():\n    from taehv_console.core.plan import derive  # noqa: F401\n")
    r = lint_imports(tmp_path)
    assert r.returncode != 0
    assert (
        "core never imports the front ends (ui, commands, headless, follow, cli, errors) BROKEN" in r.stdout
    )
    assert "taehv_console.core.models -> taehv_console.ui.app" in r.stdout
    assert "no import cycles between sibling modules or packages BROKEN" in r.stdout
    assert "nothing below ui imports ui (cli only lazily, on the TUI path) BROKEN" in r.stdout
    assert "Contracts: 1 kept, 3 broken." in r.stdout
