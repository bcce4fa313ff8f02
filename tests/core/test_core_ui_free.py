"""Core and trainer never import a UI library: the TUI and headless mode are thin callers."""

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules() -> list[str]:
    names = []
    for pkg in ("taehv_console.core", "trainer"):
        path = ROOT.joinpath(*pkg.split("."))
        names.append(pkg)
        names += [m.name for m in pkgutil.walk_packages([str(path)], prefix=pkg + ".")]
    return names


def test_every_core_and_trainer_module_imports_without_textual_or_rich():
    modules = _modules()
    assert "trainer.train" in modules and any(m.startswith("taehv_console.core.cluster.") for m in modules)
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(k for k in sys.modules if k.split('.')[0] in ('textual', 'rich'))))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
