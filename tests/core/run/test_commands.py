"""`status`, `stop`, `attach` and `resume` through the real CLI entry point, on runs driven by the
fake launchers (real processes, no DeepSpeed): what each prints and the exit status scripts see."""

from __future__ import annotations

import json

import pytest

from taehv_console.cli import main
from taehv_console.core.run.control import RunController
from taehv_console.headless import ExitCode
from tests.core.run.conftest import make_run, step_of, wait_for
from tests.core.run.test_control import _fake_checkpoint

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def finished(launch_fake):
    """A run that reached its 3 steps, its console closed."""
    ctrl = launch_fake(nodes=2, max_steps=3, step_s=0.05)
    ctrl.follow(interval=0.1)
    ctrl.lock.release()
    return ctrl.run


def _json_out(capsys) -> object:
    return json.loads(capsys.readouterr().out)


def test_status_of_one_run_and_of_all_runs(finished, launch_fake, capsys):
    runs = str(finished.path.parent)
    assert main(["status", str(finished.path), "--json"]) == 0
    info = _json_out(capsys)
    assert info["phase"] == "done" and info["progress"]["step"] == 3 and info["backend"] == "local"
    assert [n["index"] for n in info["nodes"]] == [0, 1] and all(n["pgid"] > 1 for n in info["nodes"])
    assert info["failure"] is None and info["attempt"]["outcome"] == "done"

    live = launch_fake(nodes=1, per_node=2, step_s=0.2)  # a second, running run beside it
    wait_for(lambda: step_of(live) >= 1, 30, "a step")
    assert main(["status", str(live.run.path), "--json"]) == 0
    info = _json_out(capsys)
    assert info["live"] is True and info["controlled_by"]["purpose"] == "test"
    assert all(pids for pids in info["alive"].values())

    assert main(["status", "--runs", runs, "--json"]) == 0
    listing = _json_out(capsys)
    assert [(i["run"], i["phase"]) for i in listing] == [
        (live.run.run_id, "running"),
        (finished.run_id, "done"),
    ]
    assert listing[0]["live"] is True and "live" not in listing[1]


def test_status_of_an_unknown_run_is_a_usage_error(tmp_path, capsys):
    assert main(["status", "nope", "--runs", str(tmp_path)]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


def test_stop_and_attach_on_a_run_that_already_ended(finished, capsys):
    assert main(["stop", str(finished.path), "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1])["phase"] == "done"
    assert main(["attach", str(finished.path), "--json"]) == ExitCode.DONE
    result = [json.loads(line) for line in capsys.readouterr().out.splitlines()][-1]
    assert result["kind"] == "result" and result["phase"] == "done"


def test_resume_at_another_world_size_says_how_and_starts_nothing(tmp_path, pool, capsys):
    run = make_run(tmp_path / "runs", nodes=1, per_node=2, max_steps=20)
    _fake_checkpoint(run, 4, world=8)
    assert main(["resume", str(run.path)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "8 processes" in err and "--weights-only" in err and "ds_to_universal" in err
    assert run.read_state().attempt is None


def test_resume_and_attach_are_refused_while_another_console_controls_the_run(launch_fake, capsys):
    ctrl = launch_fake(nodes=1, per_node=2, step_s=0.2)
    assert main(["resume", str(ctrl.run.path)]) == ExitCode.BUSY
    assert main(["attach", str(ctrl.run.path)]) == ExitCode.BUSY
    err = capsys.readouterr().err
    assert err.count("another console controls this run") == 2
    assert len(ctrl.run.read_state().attempts) == 1


def test_resume_refuses_a_live_run_without_a_console(launch_fake, capsys):
    ctrl = launch_fake(nodes=1, per_node=2, step_s=0.2)
    ctrl.lock.release()  # the console is gone; its launchers are not
    assert main(["resume", str(ctrl.run.path)]) == ExitCode.BUSY
    assert "attach to it instead" in capsys.readouterr().err
    with RunController.open(ctrl.run, ctrl.backend.pool) as again:
        assert again.reconcile() == "live"


def test_status_says_each_recovery_and_each_node_left_out(finished, capsys):
    """A run the console healed by leaving node 1 out: the text and the JSON both tell it."""
    from dataclasses import replace

    from taehv_console.core.run.state import Exclusion

    state = finished.read_state()
    first, *_ = state.attempts
    failed = replace(
        first,
        outcome="failed",
        cause="node-lost",
        decision="exclude",
        why="node 1 cannot be reached",
        blamed_node=1,
        ended=first.started + 5,
    )
    again = replace(first, number=2, restarted_by="recovery", from_step=2, lost_s=42.0, redone_steps=1)
    left_out = Exclusion(
        node=1,
        host="gpu-b",
        why="node 1 cannot be reached",
        time=first.started + 6,
        attempt=1,
        nodes_before=2,
        nodes_after=1,
        changes=("topology.nodes: 2 -> 1",),
        checkpoint="step-2",
    )
    finished.write_state(replace(state, attempts=(failed, again), exclusions=(left_out,)))
    assert main(["status", str(finished.path), "--no-check"]) == 0
    out = capsys.readouterr().out
    assert "attempt 1: node-lost on node 1 -> exclude: 42s lost, 1 step(s) redone" in out, out
    assert "left out: node 1 (gpu-b) after attempt 1, not replaced; 2 -> 1 node(s)" in out, out
    assert main(["status", str(finished.path), "--no-check", "--json"]) == 0
    info = _json_out(capsys)
    assert info["exclusions"][0]["host"] == "gpu-b" and info["strikes"] == {"1": 1}
    assert info["recoveries"][0]["lost_s"] == 42.0
