"""A stop, a recovery, `status` and the supervisor's liveness signal or count only the run's own
processes: a recorded pid is checked on its node (start time recorded at spawn, the run's id in
its environment) before any signal, and what cannot be proven the run's is left alone, said, and
kept in state.json's `attention`. Real processes throughout: an unrelated `sleep` holding a
recorded pid must survive, on this machine and over the loopback sshd."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.run import node
from taehv_console.core.run.control import RunController
from taehv_console.core.run.requests import probe_live, request_stop
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.run.state import Failure, Phase
from tests.core.run.conftest import alive, wait_for

pytestmark = pytest.mark.timeout(120)

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "cpu-smoke-done"
RUN_ID = "20261123-055714-cpu-smoke"


def _sleeper(env: dict[str, str] | None = None) -> subprocess.Popen:
    """An unrelated process of the same user, in a session of its own (its pid is its pgid), as
    any other job on a shared head node."""
    return subprocess.Popen(["sleep", "600"], start_new_session=True, env={**os.environ, **(env or {})})


@pytest.fixture
def sleepers():
    made: list[subprocess.Popen] = []

    def make(env: dict[str, str] | None = None) -> subprocess.Popen:
        made.append(_sleeper(env))
        time.sleep(0.05)  # exec'd: its environ and cmdline are the sleep's
        return made[-1]

    yield make
    for p in made:
        p.kill()  # the process this test started, by its own pid
        p.wait()


def running_copy(
    tmp_path: Path,
    pid: int,
    *,
    start_ticks: int | None = None,
    host: str = "localhost",
    backend: str = "local",
    events: bool = True,
) -> RunDir:
    """The issue's repro: a finished run copied, its state.json edited to say "running" with node
    0's launcher pid pointing at `pid`. Without events, its ranks never said how they ended."""
    dst = tmp_path / "runs" / RUN_ID
    shutil.copytree(FIXTURE, dst)
    if not events:
        shutil.rmtree(dst / "events")
    # no restart: a recovery must not launch training here
    (dst / "run.toml").write_text((dst / "run.toml").read_text() + "\n[recovery]\nmax_restarts = 0\n")
    state = json.loads((dst / "state.json").read_text())
    state.update(phase="running", backend=backend, hosts=[host])
    a = state["attempts"][0]
    a.update(ended=None, outcome=None)
    a["nodes"][0].update(pid=pid, pgid=pid, host=host, log=str(dst / "logs" / "node-0.log"))
    if start_ticks is not None:
        a["nodes"][0]["start_ticks"] = start_ticks
    (dst / "state.json").write_text(json.dumps(state))
    return RunDir(dst)


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 90):
    return subprocess.run(
        [sys.executable, "-m", "taehv_console.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


# ------------------------------------------------------------------------- the node-side check


def test_identity_needs_the_start_time_and_the_runs_mark(sleepers):
    plain = sleepers()
    marked = sleepers({node.RUN_ID_ENV: RUN_ID})
    other_run = sleepers({node.RUN_ID_ENV: "20990101-000000-other"})
    t_plain, t_marked = node.start_ticks(plain.pid), node.start_ticks(marked.pid)
    rec = node.Recorded

    assert node.identify(rec(marked.pid, t_marked, node.boot_id(), RUN_ID, 0, 1))[0] == node.OURS
    # a reused pid: the start time differs from the one recorded at spawn
    verdict, why = node.identify(rec(marked.pid, (t_marked or 0) - 1, "", RUN_ID, 0, 1))
    assert verdict == node.FOREIGN and "another process" in why and str(marked.pid) in why
    # the right start time, but the process is not the run's (the edited state.json)
    verdict, why = node.identify(rec(plain.pid, t_plain, "", RUN_ID, 0, 1))
    assert verdict == node.FOREIGN and node.RUN_ID_ENV in why and "sleep 600" in why
    assert node.identify(rec(other_run.pid, node.start_ticks(other_run.pid), "", RUN_ID, 0, 1))[0] == (
        node.FOREIGN
    )
    # the run's mark, but no start time recorded: it may be another of the run's processes
    verdict, why = node.identify(rec(marked.pid, None, "", RUN_ID, 0, 1))
    assert verdict == node.UNPROVEN and "no start time" in why
    # another boot: whatever holds the pid now, the recorded process is gone
    assert node.identify(rec(marked.pid, t_marked, "not-this-boot", RUN_ID, 0, 1))[0] == node.GONE


def test_a_leader_that_exits_while_it_is_checked_is_gone_not_unproven(sleepers):
    """The table says alive, then the leader exits before its environment is read: a zombie shows
    none, which alone would read as "cannot be read". A stop's last look at an exiting launcher
    once put that in the run's attention (CI, a loaded machine); a fresh look finds it gone."""
    marked = sleepers({node.RUN_ID_ENV: RUN_ID})
    rec = node.Recorded(marked.pid, node.start_ticks(marked.pid), node.boot_id(), RUN_ID, 0, 1)
    stale = node.read_proc()
    assert stale[marked.pid][3] != "Z"
    marked.kill()  # not reaped: a zombie, as a launcher is until its parent waits for it
    wait_for(lambda: (node.read_proc_one(marked.pid) or (0, 0, 0, "Z"))[3] == "Z", 10, "the zombie")
    assert node._environ(marked.pid, "/proc") is None  # what the stale table's answer would rest on
    assert node.identify(rec, stale) == (node.GONE, "")


def test_the_node_tool_signals_only_a_proven_group(sleepers):
    plain, marked = sleepers(), sleepers({node.RUN_ID_ENV: RUN_ID})
    parser = node.build_parser()

    def kill(p: subprocess.Popen, *extra: str) -> dict:
        args = ["kill", "--pgid", str(p.pid), "--run-id", RUN_ID, "--node", "0", "--attempt", "1", *extra]
        return node.tree_command(parser.parse_args([*args, "--signal", "KILL"]))

    # the old way: a pid and nothing else, as when the status file is missing
    out = kill(plain)
    assert out["identity"] == node.FOREIGN and out["signalled"] == [] and out["left"] == []
    out = kill(marked)  # marked, but no start time
    assert out["identity"] == node.UNPROVEN and out["signalled"] == []
    out = kill(plain, "--start-ticks", str(node.start_ticks(plain.pid)))
    assert out["identity"] == node.FOREIGN and out["signalled"] == []
    time.sleep(0.2)
    assert alive(plain.pid) and alive(marked.pid)

    out = kill(marked, "--start-ticks", str(node.start_ticks(marked.pid)))
    assert out["identity"] == node.OURS and out["signalled"] == [marked.pid] and out["left"] == []
    marked.wait(5)


def test_a_launch_records_its_identity_at_spawn(launch_fake):
    ctrl = launch_fake(nodes=1, per_node=2, step_s=0.2)
    n = ctrl.attempt.nodes[0]
    on_disk = json.loads(ctrl.run.state_path.read_text())["attempts"][-1]["nodes"][0]
    assert n.start_ticks == node.start_ticks(n.pid) == on_disk["start_ticks"]
    assert n.boot_id == node.boot_id() != ""
    environ = Path(f"/proc/{n.pid}/environ").read_bytes().split(b"\0")
    assert f"{node.RUN_ID_ENV}={ctrl.run.run_id}".encode() in environ
    # the wrapper's status file is not needed to prove it: a stop still reaches the run
    wait_for(ctrl.run.node_status_path(0).exists, 20, "node 0's status file")
    ctrl.run.node_status_path(0).unlink()
    assert ctrl.live_nodes()
    ctrl.stop(grace_s=10)
    assert ctrl.state.stop.verified and ctrl.state.attention == ()
    assert not alive(n.pid)


# ------------------------------------------------------------------------- the repro, CLI


def test_stop_spares_an_unrelated_process_at_a_recorded_pid(tmp_path, sleepers):
    sleeper = sleepers()
    run = running_copy(tmp_path, sleeper.pid)
    out = cli("status", RUN_ID, "--runs", "runs", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["live"] is False and info["alive"] == {"0": []}
    assert "sleep 600" in info["not_the_runs"]["0"]
    assert info["phase"] == "running"  # status writes nothing
    plain = cli("status", RUN_ID, "--runs", "runs", cwd=tmp_path)
    assert "not the run's" in plain.stdout and "alive: [" not in plain.stdout

    out = cli("stop", RUN_ID, "--runs", "runs", "--grace", "5", cwd=tmp_path)
    time.sleep(0.3)
    assert alive(sleeper.pid), out.stdout + out.stderr
    assert out.returncode == 0, out.stderr  # its launcher is gone: the run has ended (done)
    assert "SIGTERM sent" not in out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert f"pid {sleeper.pid} (sleep 600) is not the run's" in text and "no signal sent" in text
    state = run.read_state()
    assert state.phase is Phase.DONE and state.attempt.ended is not None
    assert len(state.attention) == 1 and str(sleeper.pid) in state.attention[0]
    assert "Traceback" not in text


def test_stop_fails_closed_on_a_process_it_cannot_prove(tmp_path, sleepers):
    # the run's id in its environment, but no start time recorded anywhere (no status file)
    sleeper = sleepers({node.RUN_ID_ENV: RUN_ID})
    run = running_copy(tmp_path, sleeper.pid)
    out = cli("stop", RUN_ID, "--runs", "runs", "--grace", "1", "--json", cwd=tmp_path)
    time.sleep(0.3)
    assert alive(sleeper.pid), out.stdout + out.stderr
    assert out.returncode == 1, out.stderr  # stop's "something of it could not be stopped"
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["nothing_left"] is False and result["killed"] == []
    assert any("no start time was recorded" in line for line in result["attention"])
    assert "no start time was recorded" in out.stderr
    assert run.read_state().attention == tuple(result["attention"])


def test_recovery_stops_nothing_it_cannot_prove(tmp_path, sleepers, pool):
    """After a failure the controller stops every other node (SIGTERM, grace, SIGKILL): not a
    process it cannot prove the run's. Then a run whose recorded processes are gone is reconciled
    as ended, not alive."""
    unproven = sleepers({node.RUN_ID_ENV: RUN_ID})
    run = running_copy(tmp_path, unproven.pid, events=False)
    with RunController.open(run, pool, purpose="test") as ctrl:
        assert ctrl.live_nodes() == {0: ()}  # unknown counts as live: never launch twice
        ctrl._fail(Failure(reason="a rank failed", node=0, detected=time.time()))
        assert ctrl.state.phase is Phase.FAILED
        assert any("no signal sent" in line for line in ctrl.state.attention)
    time.sleep(0.3)
    assert alive(unproven.pid)

    foreign = sleepers()
    run2 = running_copy(tmp_path / "b", foreign.pid, events=False)
    with RunController.open(run2, pool, purpose="test") as ctrl:
        assert ctrl.reconcile() == "ended"
        assert ctrl.state.phase is Phase.FAILED and ctrl.attempt.ended is not None
        assert "not the run's" in ctrl.state.attention[0]
    assert alive(foreign.pid)


def test_supervisor_spares_an_unrelated_process(tmp_path, sleepers):
    sleeper = sleepers()
    running_copy(tmp_path, sleeper.pid, events=False)
    out = cli("supervise", RUN_ID, "--runs", "runs", cwd=tmp_path)
    time.sleep(0.3)
    assert alive(sleeper.pid), out.stdout + out.stderr
    assert out.returncode in (1, 6), out.stderr  # the run failed (its launcher vanished)
    assert "Traceback" not in out.stdout + out.stderr


# ------------------------------------------------------------------------- over SSH


def test_over_ssh_an_unrelated_process_survives_status_stop_and_recovery(tmp_path, sshd, sleepers):
    host = sshd.hosts[0].host  # 127.0.0.2: reached over SSH, the node tool runs there
    sleeper = sleepers()
    run = running_copy(tmp_path, sleeper.pid, host=host, backend="ssh")
    with SshPool(sshd.settings()) as pool:
        refused: dict[int, str] = {}
        _state, procs = probe_live(run, pool, refused)
        assert procs == {0: ()} and "sleep 600" in refused[0]
        state = request_stop(run, pool, grace_s=5)
        assert state.phase.ended and str(sleeper.pid) in state.attention[0]

        unproven = sleepers({node.RUN_ID_ENV: RUN_ID})
        run2 = running_copy(tmp_path / "b", unproven.pid, host=host, backend="ssh", events=False)
        with RunController.open(run2, pool, purpose="test") as ctrl:
            assert ctrl.live_nodes() == {0: ()}
            ctrl._fail(Failure(reason="a rank failed", node=0, detected=time.time()))
            assert any("no start time was recorded" in line for line in ctrl.state.attention)
    time.sleep(0.3)
    assert alive(sleeper.pid) and alive(unproven.pid)
