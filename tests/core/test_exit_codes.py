"""One exit-code API: every command returns taehv_console.exit_codes.ExitCode, names the codes it
can return in EXIT_CODES, and its `--help` lists them. A bare integer in a command's return (or an
exit call) fails here, and so does a code it returns but does not document."""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

from taehv_console.cli import COMMANDS, build_parser, main
from taehv_console.exit_codes import ExitCode, exit_code_for

ROOT = Path(__file__).resolve().parents[2]
COMMAND_FILES = sorted((ROOT / "taehv_console" / "commands").glob("*.py")) + [
    ROOT / "taehv_console" / "cli.py"
]
EXITS = {"exit", "_exit", "SystemExit"}  # sys.exit(...), os._exit(...), raise SystemExit(...)


def int_constants(node: ast.AST | None) -> list[int]:
    """The integer literals a returned expression can evaluate to (through `a if c else b`, `a or b`)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [node.value]
    if isinstance(node, ast.IfExp):
        return int_constants(node.body) + int_constants(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [v for value in node.values for v in int_constants(value)]
    return []


def assigned(targets: list[ast.expr]) -> list[ast.expr]:
    return [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]


def bare_exit_codes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        values: list[ast.AST | None] = []
        if isinstance(node, ast.Return):
            values = [node.value]
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in EXITS:
                values = list(node.args)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id.startswith("EXIT_") for t in assigned(node.targets)
        ):
            values = [node.value, *getattr(node.value, "elts", [])]  # EXIT_OK = 0, or a, b = 0, 1
        for value in values:
            found += [f"{path.name}:{node.lineno}: {n}" for n in int_constants(value)]
    return found


def test_the_bare_integer_check_would_notice_one(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import sys\nEXIT_OK, EXIT_BAD = 0, 1\n"
        "def run(a):\n    if a:\n        return 0 if a else 1\n    sys.exit(2)\n"
    )
    assert len(bare_exit_codes(bad)) == 5


@pytest.mark.parametrize("path", COMMAND_FILES, ids=lambda p: p.name)
def test_no_command_returns_a_bare_integer(path):
    assert bare_exit_codes(path) == []


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_documents_its_codes_as_exit_code_members(command):
    module_name, _help = COMMANDS[command]
    module = importlib.import_module(module_name)
    codes = module.EXIT_CODES
    assert codes and all(isinstance(c, ExitCode) for c in codes), codes
    assert all(isinstance(m, str) and m for m in codes.values())
    # argparse's own errors exit 2, and main turns Ctrl-C into 130: every command can return them
    assert {ExitCode.USAGE, ExitCode.INTERRUPTED} <= set(codes)
    # every code the module names is documented (EXIT_CODES itself names them all, so look elsewhere)
    source = Path(module.__file__)
    tree = ast.parse(source.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "EXIT_CODES" for t in node.targets):
            tree.body.remove(node)
    used = {
        ExitCode[n.attr]
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "ExitCode"
    }
    assert used <= set(codes), f"{command} returns {used - set(codes)} without documenting it"
    # a command that reports how a run ended can return whatever exit_code_for gives
    text = source.read_text()
    if any(f in text for f in ("follow(", "report_ended(", "report_outcome(", "exit_code_for(")):
        ended = {exit_code_for(p, final) for p in ("done", "stopped", "failed") for final in (False, True)}
        assert ended <= set(codes), command


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_commands_help_lists_its_codes(command, capsys):
    module = importlib.import_module(COMMANDS[command][0])
    with pytest.raises(SystemExit) as exc:
        build_parser(command).parse_args([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    listed = out[out.index("exit codes:") :]
    for code in module.EXIT_CODES:
        assert re.search(rf"^\s+{int(code)}\s+\S", listed, re.MULTILINE), (command, code)


def test_the_docs_table_has_every_code():
    for doc in (ROOT / "README.md", ROOT / "docs" / "design.md"):
        text = doc.read_text()
        for code in ExitCode:
            assert re.search(rf"^\| {int(code)} \| `?{code.name}`? \|", text, re.MULTILINE), (doc.name, code)


def test_preflight_with_a_missing_data_directory_exits_preflight_failed(tmp_path, monkeypatch, capsys):
    # as `--no-tui` does for the same finding (tests/e2e/test_headless.py): 3, not 1
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX"):
        monkeypatch.delenv(var, raising=False)
    for var in ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    code = main(
        ["--data", str(tmp_path / "no-such-videos"), "preflight", "--runs", str(tmp_path / "runs"), "--json"]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == ExitCode.PREFLIGHT_FAILED == 3
    assert any(f["id"] == "data-missing" and f["severity"] == "error" for f in report["findings"])
