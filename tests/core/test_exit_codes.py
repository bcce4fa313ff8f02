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
    # argparse's own errors exit 2, main turns Ctrl-C into 130 and a bug into 70 (CRASHED): every
    # command can return them
    assert {ExitCode.USAGE, ExitCode.INTERRUPTED, ExitCode.CRASHED} <= set(codes)
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


# ------------------------------------------------------------------ errors.py: one mapping, no traceback


def test_each_error_maps_by_its_nearest_class():
    from taehv_console.core.run.outcome import ControlError, NothingToResumeError, RunLiveError
    from taehv_console.core.values import InputError
    from taehv_console.errors import exit_code_for_error
    from trainer.config import ConfigError
    from trainer.errors import WeightsError

    assert exit_code_for_error(RunLiveError("live")) == ExitCode.BUSY  # not ControlError's FAILED
    assert exit_code_for_error(ControlError("x")) == ExitCode.FAILED
    assert exit_code_for_error(NothingToResumeError("x")) == ExitCode.USAGE
    assert exit_code_for_error(InputError("x")) == ExitCode.USAGE
    assert exit_code_for_error(WeightsError("x")) == ExitCode.USAGE
    assert exit_code_for_error(type("Sub", (ConfigError,), {})("x")) == ExitCode.USAGE
    assert exit_code_for_error(ValueError("x")) is None  # not the project's: a bug
    assert exit_code_for_error(KeyError("x")) is None


def test_an_unexpected_error_is_one_line_naming_its_crash_log(tmp_path, monkeypatch, capsys):
    from taehv_console.commands import presets

    def boom(args):
        raise TypeError("unsupported operand")

    monkeypatch.setenv("TAEHV_CRASH_DIR", str(tmp_path / "crashes"))
    monkeypatch.setattr(presets, "run", boom)
    code = main(["presets"])
    err = capsys.readouterr().err
    assert code == ExitCode.CRASHED == 70  # not 1, which platforms retry
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    (log,) = (tmp_path / "crashes").iterdir()
    assert str(log) in err and "TypeError: unsupported operand" in err
    text = log.read_text()
    assert "Traceback" in text and "in boom" in text and "'presets'" in text


def test_a_known_error_from_any_command_is_its_code_and_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TAEHV_CRASH_DIR", str(tmp_path / "crashes"))
    code = main(["resume", "no-such-run", "--runs", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert err.startswith("taehv-console resume: ") and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "crashes").exists()


def test_the_headless_flow_says_an_unexpected_error_in_its_json_result(tmp_path, monkeypatch, capsys):
    from taehv_console import headless

    def boom(options, pool):
        raise RuntimeError("odd")

    monkeypatch.setenv("TAEHV_CRASH_DIR", str(tmp_path / "crashes"))
    monkeypatch.setattr(headless, "detect", boom)
    code = main(["--no-tui", "--json", "--runs", str(tmp_path / "runs")])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert code == ExitCode.CRASHED
    assert lines[-1]["kind"] == "result" and lines[-1]["exit_code"] == 70, lines[-1]
    assert "crash" in lines[-1]["error"] and "RuntimeError: odd" in lines[-1]["error"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["preflight", "--master-port", "70000"], "port 70000: must be 1-65535"),
        (["plan", "--nodes", "0"], "at least 1"),
        (["plan", "--preset", "8gpu-h100", "--price", "-1"], "at least 0"),
        (["detect", "--parallel", "0"], "at least 1"),
        (["detect", "--connect-timeout", "-1"], "more than 0"),
        (["eval", "w.safetensors", "--data", "d", "--clips", "-1"], "at least 0"),
        (["render", "--preset", "cpu-smoke", "--out", "x", "--port", "0"], "must be 1-65535"),
    ],
)
def test_values_out_of_range_are_named_where_they_enter(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == ExitCode.USAGE
    assert words in capsys.readouterr().err
