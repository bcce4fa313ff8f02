"""Damaged run files are read, never trusted: a corpus of broken `state.json`, `run.toml` and lost
state goes through every run command (`status`, `stop`, `attach`, `resume`, `--no-tui --run`)
through the CLI's own `main()`. Each must name the file (and the field) and exit 2, as its
--help says, with no traceback and nothing rewritten; listing runs (`--runs DIR`) passes over a
damaged run with a one-line note and goes on with the others."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from taehv_console.cli import main
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.run.state import Phase, read_node_status

pytestmark = pytest.mark.timeout(300)

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "cpu-smoke-done"
GOOD = json.loads((FIXTURE / "state.json").read_text())


def _state(change: Callable[[dict[str, Any]], None]) -> bytes:
    data = json.loads(json.dumps(GOOD))
    change(data)
    return json.dumps(data).encode()


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = data
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return change


# name -> (file, its new bytes (None: removed), words the message must hold)
CORPUS: dict[str, tuple[str, bytes | None, tuple[str, ...]]] = {
    "attempts-not-a-list": ("state.json", _state(_set("attempts", "notalist")), ("field attempts",)),
    "attempt-not-an-object": ("state.json", _state(_set("attempts", ["x"])), ("field attempts.0",)),
    "nodes-not-a-list": ("state.json", _state(_set("attempts.0.nodes", "x")), ("attempts.0.nodes",)),
    "pid-not-a-number": ("state.json", _state(_set("attempts.0.nodes.0.pid", "abc")), ("nodes.0.pid",)),
    "pid-null": ("state.json", _state(_set("attempts.0.nodes.0.pid", None)), ("nodes.0.pid",)),
    "hosts-a-string": ("state.json", _state(_set("hosts", "localhost")), ("field hosts",)),
    "env-a-list": ("state.json", _state(_set("env", [1, 2])), ("field env",)),
    "phase-a-number": ("state.json", _state(_set("phase", 7)), ("field phase",)),
    "phase-unknown": ("state.json", _state(_set("phase", "sleeping")), ("field phase",)),
    "backend-unknown": ("state.json", _state(_set("backend", "moon")), ("field backend",)),
    "failure-a-string": ("state.json", _state(_set("failure", "boom")), ("field failure",)),
    "stop-a-list": ("state.json", _state(_set("stop", [1])), ("field stop",)),
    "exclusions-an-object": ("state.json", _state(_set("exclusions", {"a": 1})), ("field exclusions",)),
    "event-offsets-odd": ("state.json", _state(_set("attempts.0.event_offsets", [[1]])), ("event_offsets",)),
    "attention-a-number": ("state.json", _state(_set("attention", 3)), ("field attention",)),
    "truncated": ("state.json", (FIXTURE / "state.json").read_bytes()[:200], ("not JSON",)),
    "empty": ("state.json", b"", ("not JSON",)),
    "json-array": ("state.json", b"[1, 2, 3]\n", ("JSON array",)),
    "json-string": ("state.json", b'"running"\n', ("JSON string",)),
    "json-null": ("state.json", b"null\n", ("JSON null",)),
    "binary": ("state.json", bytes(range(256)) * 2, ("binary",)),
    "nested-deep": ("state.json", b"[" * 100000 + b"]" * 100000, ("state.json",)),
    "state-lost": ("state.json", None, ("missing, but a console launched the run",)),
    "toml-not-toml": ("run.toml", b"this is [not toml\n", ("run.toml", "TOML")),
    "toml-binary": ("run.toml", bytes(range(256)), ("run.toml",)),
    "toml-wrong-type": ("run.toml", b'[topology]\nnodes = "two"\n', ("run.toml", "topology.nodes")),
}

COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "status": lambda run, runs: ["status", str(run), "--runs", str(runs)],
    "status --json": lambda run, runs: ["status", str(run), "--runs", str(runs), "--json"],
    "stop": lambda run, runs: ["stop", str(run), "--runs", str(runs), "--grace", "1"],
    "attach": lambda run, runs: ["attach", str(run), "--runs", str(runs)],
    "resume": lambda run, runs: ["resume", str(run), "--runs", str(runs)],
    "--no-tui": lambda run, runs: ["--no-tui", "--run", str(run), "--runs", str(runs)],
}


@pytest.fixture(autouse=True)
def _no_state_too_deep_to_read(tmp_path):
    """The test session's reaper reads every state.json under the base temp with json.loads, which
    a too deeply nested one breaks (RecursionError): that one goes when its test is over."""
    yield
    for path in tmp_path.rglob("state.json"):
        try:
            json.loads(path.read_bytes())
        except RecursionError:
            path.unlink()
        except ValueError:
            pass


def damaged_copy(runs: Path, name: str, run_id: str | None = None) -> RunDir:
    file, content, _words = CORPUS[name]
    dst = runs / (run_id or f"20261123-055714-{name}")
    shutil.copytree(FIXTURE, dst)
    (dst / "lock").touch()  # a console launched it (it keeps the lock file, emptied on release)
    if content is None:
        (dst / file).unlink()
    else:
        (dst / file).write_bytes(content)
    return RunDir(dst)


def _files(run: RunDir) -> dict[str, bytes | None]:
    return {
        n: (run.path / n).read_bytes() if (run.path / n).exists() else None
        for n in ("state.json", "run.toml")
    }


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_run_command_names_a_damaged_run_and_exits_2(tmp_path, capsys, name):
    runs = tmp_path / "runs"
    run = damaged_copy(runs, name)
    before = _files(run)
    words = CORPUS[name][2]
    for command, argv in COMMANDS.items():
        code = main(argv(run.path, runs))  # an uncaught exception fails the test right here
        out = capsys.readouterr()
        text = out.out + out.err
        assert code == 2, f"{command}: exit {code}\n{text}"
        assert "Traceback" not in text, f"{command}\n{text}"
        assert all(w in text for w in words), f"{command}: {words} not in\n{text}"
        assert str(run.path) in text, f"{command} does not say which run\n{text}"
        assert _files(run) == before, f"{command} rewrote the damaged run's files"


def test_a_damaged_status_file_is_never_trusted(tmp_path, capsys):
    """A node's status file is the wrapper's word on who it is: damaged, it is no identity."""
    run = damaged_copy(tmp_path / "runs", "truncated")
    (run.path / "state.json").write_bytes((FIXTURE / "state.json").read_bytes())
    for content in (b"[1]", b'{"node": "x"}', bytes(range(256)), b"{"):
        run.node_status_path(0).parent.mkdir(exist_ok=True)
        run.node_status_path(0).write_bytes(content)
        assert read_node_status(run.node_status_path(0)) is None
        assert main(["status", str(run.path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["phase"] == "done"


@pytest.fixture
def runs_with_damage(tmp_path) -> tuple[Path, RunDir]:
    """Every damaged run of the corpus, newer than one healthy run that says "running" although
    its launcher is gone (a console that died): what `stop` and `attach` must find."""
    runs = tmp_path / "runs"
    for i, name in enumerate(sorted(CORPUS)):
        damaged_copy(runs, name, f"20261124-{i:06d}-{name}")
    healthy = RunDir(runs / "20261101-000000-cpu-smoke")
    shutil.copytree(FIXTURE, healthy.path)
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid nothing holds now
    data = json.loads(json.dumps(GOOD))
    data["phase"] = "running"
    data["attempts"][0].update(ended=None, outcome=None)
    data["attempts"][0]["nodes"][0].update(pid=gone.pid, pgid=gone.pid)
    healthy.state_path.write_text(json.dumps(data))
    return runs, healthy


def _skips(text: str) -> int:
    return sum(1 for line in text.splitlines() if "skipping 20261124-" in line)


def test_status_lists_the_runs_it_can_read_and_names_the_others(runs_with_damage, capsys):
    runs, healthy = runs_with_damage
    assert main(["status", "--runs", str(runs)]) == 0
    out = capsys.readouterr()
    assert healthy.run_id in out.out and "Traceback" not in out.out + out.err
    assert _skips(out.err) == len(CORPUS)  # one line each, by name
    assert main(["status", "--runs", str(runs), "--json", "--no-check"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sum(bool(i.get("error")) for i in listed) == len(CORPUS)
    assert [i["run"] for i in listed if not i.get("error")] == [healthy.run_id]


@pytest.mark.parametrize("command", ["stop", "attach"])
def test_stop_and_attach_pass_over_damaged_runs(runs_with_damage, capsys, command):
    runs, healthy = runs_with_damage
    before = {p.name: _files(RunDir(p)) for p in runs.iterdir()}
    assert main([command, "--runs", str(runs), "--grace", "1"]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    assert _skips(out.err) >= 1
    assert healthy.read_state().phase is Phase.DONE  # reconciled: its launcher was gone
    after = {p.name: _files(RunDir(p)) for p in runs.iterdir() if p != healthy.path}
    assert after == {k: v for k, v in before.items() if k != healthy.run_id}


def test_no_tui_passes_over_damaged_runs(runs_with_damage, capsys):
    runs, _healthy = runs_with_damage
    # the --set error stops it after it has looked for a live run, before anything is launched
    code = main(["--no-tui", "--runs", str(runs), "--set", "optim.max_steps=-5"])
    out = capsys.readouterr()
    assert code == 2 and "Traceback" not in out.out + out.err
    # it looks at the newest 20 runs; those whose state.json is damaged are each passed over
    skipped = [line for line in (out.out + out.err).splitlines() if "skipping 20261124-" in line]
    assert len(skipped) >= 10 and all("state.json" in line for line in skipped)
    assert "optim.max_steps" in out.err


def test_a_damaged_run_gives_no_traceback_from_the_installed_command(tmp_path):
    """The same through a real process, as a user types it (the issue's example)."""
    runs = tmp_path / "runs"
    run = damaged_copy(runs, "attempts-not-a-list")
    for argv in (["status", "--runs", str(runs)], ["status", str(run.path)], ["stop", "--runs", str(runs)]):
        out = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "taehv-console"), *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "Traceback" not in out.stdout + out.stderr and "AttributeError" not in out.stderr
        assert out.returncode in (0, 2), out.stderr
