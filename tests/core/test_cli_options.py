"""An option the top level and a command share means the same wherever it stands: `taehv-console
--runs DIR status` is `taehv-console status --runs DIR`. argparse alone dropped the first (a
subcommand's defaults overwrote it: `--runs DIR status` listed ./runs). Every command's shared
options are found from its real parser, so an option added later is checked too."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import pytest

from taehv_console.cli import COMMANDS, build_parser, console_options
from taehv_console.commands.options import SHARED, SPEC
from tests.core.run.conftest import make_run

# what a command needs besides the option under test for its line to parse
REQUIRED: dict[str, list[str]] = {
    "render": ["--out", "OUT", "--preset", "P"],
    "supervise": ["R"],
    "eval": ["W", "--data", "D"],
}


def parse(argv: list[str]) -> dict[str, Any]:
    command = next((a for a in argv if a in COMMANDS), None)
    return vars(build_parser(command).parse_args(argv))


def shared_of(command: str) -> list[str]:
    """The dests of the shared options `command` takes, read from its registered parser."""
    parser = build_parser(command)
    return sorted(parser.commands[command].get_default(SPEC))


def sample(dest: str) -> tuple[list[str], list[str], Any]:
    """(given before the command, given after it, the value both must parse to)."""
    opt = SHARED[dest]
    if opt.action == "store_true":
        return [opt.flag], [opt.flag], True
    if opt.action == "append":
        return [opt.flag, "K=V"], [opt.flag, "K=V"], ["K=V"]
    if opt.choices:
        return [opt.flag, opt.choices[-1]], [opt.flag, opt.choices[-1]], opt.choices[-1]
    if opt.type is int:
        return [opt.flag, "7"], [opt.flag, "7"], 7
    if opt.type is float:
        return [opt.flag, "2.5"], [opt.flag, "2.5"], 2.5
    if opt.type not in (None, str):  # a checked number (commands/options.py): a value it takes
        for text in ("7", "2.5"):
            try:
                value = opt.type(text)
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                continue
            return [opt.flag, text], [opt.flag, text], value
    if dest == "run":  # the commands take RUN as a positional argument, the top level as --run
        return ["--run", "some-run"], ["some-run"], "some-run"
    return [opt.flag, "/some/where"], [opt.flag, "/some/where"], "/some/where"


CASES = [(command, dest) for command in COMMANDS for dest in shared_of(command)]


def test_every_command_shares_what_it_should():
    taken = {c: set(shared_of(c)) for c in COMMANDS}
    ssh = {"ssh_config", "known_hosts", "python", "connect_timeout", "parallel"}
    for command in ("detect", "preflight", "trust", "status", "stop", "resume", "attach", "supervise"):
        assert ssh <= taken[command], command
    for command in ("detect", "preflight", "status", "stop", "resume", "attach", "supervise"):
        assert "runs" in taken[command], command
    for command in ("status", "stop", "resume", "attach", "supervise"):
        assert "run" in taken[command], command
    for command in COMMANDS:
        if command not in ("supervise", "trust"):  # a log, and a dialogue: no JSON
            assert "json" in taken[command], command
    assert {"preset", "overrides"} <= taken["plan"] & taken["render"] & taken["preflight"]
    assert {"hosts", "data"} <= taken["detect"] & taken["preflight"]
    assert "hosts" in taken["render"] and "hosts" in taken["trust"]
    assert {"grace"} <= taken["stop"] & taken["resume"] & taken["attach"]
    assert "launch_env" in taken["resume"] and "master_port" in taken["preflight"]


@pytest.mark.parametrize(("command", "dest"), CASES, ids=[f"{c}-{d}" for c, d in CASES])
def test_a_shared_option_parses_the_same_before_and_after_the_command(command, dest):
    before, after, want = sample(dest)
    rest = [a for a in REQUIRED.get(command, []) if not (dest == "run" and command == "supervise")]
    if dest == "preset" and command == "render":
        rest = ["--out", "OUT"]
    if dest == "data" and command == "eval":
        rest = ["W"]
    given_before = parse([*before, command, *rest])
    given_after = parse([command, *rest, *after])
    assert given_before[dest] == given_after[dest] == want
    # nothing else differs either, and no top-level copy is left behind
    assert given_before == given_after
    assert not any(k.startswith("before_") for k in given_before)


def test_runs_before_status_is_not_replaced_by_the_default():
    assert parse(["--runs", "/data/runs", "status"])["runs"] == "/data/runs"
    assert parse(["--runs", "/data/runs", "attach"])["runs"] == "/data/runs"
    assert parse(["status"])["runs"] == "runs"


def test_after_the_command_wins_and_repeatable_options_collect_from_both_places():
    args = parse(["--runs", "a", "--json", "status", "--runs", "b"])
    assert args["runs"] == "b" and args["json"] is True
    args = parse(["--set", "optim.lr=1", "plan", "--set", "optim.max_steps=2"])
    assert args["overrides"] == ["optim.lr=1", "optim.max_steps=2"]
    args = parse(["--env", "A=1", "resume", "--env", "B=2"])
    assert args["launch_env"] == ["A=1", "B=2"]


def test_each_command_keeps_its_own_defaults():
    assert parse(["detect"])["runs"] is None  # detect checks a runs directory only when named
    assert parse(["preflight"])["runs"] == "runs" and parse(["preflight"])["preset"] == "auto"
    assert parse(["plan"])["preset"] is None  # no preset: the comparison table
    assert parse(["plan"])["overrides"] == [] and parse(["status"])["json"] is False
    assert parse(["status"])["run"] is None and parse(["status"])["ssh_config"] is None


def test_the_top_level_alone_keeps_its_defaults_and_values():
    options, theme = console_options(["--runs", "/r", "--set", "a=1", "--theme", "light"])
    assert options.runs == "/r" and options.overrides == ("a=1",) and theme == "light"
    options, theme = console_options([])
    assert options.runs == "runs" and options.preset == "auto" and options.backend is None and theme is None
    assert parse([])["no_tui"] is False and parse([])["backend"] == "auto"


@pytest.mark.parametrize(
    "argv",
    [
        ["--backend", "ssh", "status"],  # the flow's option, which status has no use for
        ["--theme", "light", "plan"],
        ["--no-tui", "presets"],
        ["--runs", "r", "plan"],
        ["--grace", "3", "detect"],
    ],
)
def test_an_option_the_command_does_not_take_is_a_usage_error_not_ignored(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    assert f"{argv[0]} is not an option of `{argv[-1]}`" in capsys.readouterr().err


def test_required_shared_options_are_required_wherever_they_may_stand(capsys):
    with pytest.raises(SystemExit) as exc:
        parse(["render", "--out", "o"])
    assert exc.value.code == 2 and "--preset" in capsys.readouterr().err
    assert parse(["--preset", "p", "render", "--out", "o"])["preset"] == "p"
    with pytest.raises(SystemExit) as exc:
        parse(["supervise"])
    assert exc.value.code == 2 and "RUN" in capsys.readouterr().err
    assert parse(["--run", "r1", "supervise"])["run"] == "r1"


def test_runs_before_status_lists_the_run_in_a_real_process(tmp_path):
    runs = tmp_path / "elsewhere" / "runs"
    run = make_run(runs, nodes=1)
    assert (run.path / "run.toml").is_file() and (run.path / "state.json").is_file()
    # from a folder with no runs/ of its own: before the fix this said "no runs in runs"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "taehv_console.cli", "--runs", str(runs), "status", "--json"],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    listed = json.loads(proc.stdout)
    assert [r["run"] for r in listed] == [run.run_id]
    assert listed[0]["run_dir"] == str(run.path)
