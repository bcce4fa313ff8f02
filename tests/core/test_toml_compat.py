"""Python 3.10 is supported (pyproject: requires-python >= 3.10), where `tomllib` does not exist:
every TOML reader of the console goes through core/toml_compat.py (tomllib, or tomli before 3.11),
so no module can import tomllib bare again (ui/themes.py and ui/config.py did, and the TUI did not
start on 3.10). trainer/ keeps its own guarded import: it never imports taehv_console."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPAT = ROOT / "taehv_console" / "core" / "toml_compat.py"


def _imports_of(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module))
    return out


def test_only_the_compat_module_imports_tomllib_or_tomli():
    files = sorted((ROOT / "taehv_console").rglob("*.py"))
    assert len(files) > 50
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in files
        if path != COMPAT
        for line, name in _imports_of(path)
        if name.split(".")[0] in ("tomllib", "tomli")
    ]
    assert offenders == []
    assert {name for _, name in _imports_of(COMPAT)} >= {"tomllib", "tomli"}


def test_the_toml_readers_use_it():
    for rel in ("ui/themes.py", "ui/config.py", "core/plan/presets.py"):
        names = {name for _, name in _imports_of(ROOT / "taehv_console" / rel)}
        assert "taehv_console.core.toml_compat" in names, rel
