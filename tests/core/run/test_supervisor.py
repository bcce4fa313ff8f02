"""The run's supervisor on real processes: a console process launches a run of fake torchrun
launchers and holds its lock; the supervisor (the real loop in core/flow/supervisor.py, in a
process of its own) waits in standby, takes over when the console is SIGKILLed (a closed terminal,
a lost SSH session), heals a rank killed afterwards, hands the run to a console that asks for it
and takes it back when that console goes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from taehv_console.core.run import supervision
from taehv_console.core.run.control import RunController
from taehv_console.core.run.lock import read_holder
from taehv_console.core.run.requests import request_stop
from taehv_console.core.run.state import Phase
from tests.core.run.conftest import holder, kill_console, make_run, rank_pid, start_supervisor, wait_for

pytestmark = pytest.mark.timeout(180)


def test_the_supervisor_takes_over_from_a_killed_console_and_heals_a_rank_killed_afterwards(supervised_run):
    run, console, sup = supervised_run()
    wait_for(lambda: holder(run) == "test console", 10, "the console to hold the lock")
    wait_for(lambda: supervision.running_supervisor(run) is not None, 20, "the supervisor's info file")
    wait_for(lambda: (run.checkpoints / "step-3").is_dir(), 60, "the first checkpoint")
    kill_console(console)  # the terminal closes: nobody follows the run but the supervisor
    wait_for(lambda: holder(run) == supervision.PURPOSE, 15, "the supervisor to take the lock")
    os.kill(rank_pid(run, 1), signal.SIGKILL)
    assert sup.wait(150) == 0, supervision.log_path(run).read_text()
    state = run.read_state()
    assert state.phase is Phase.DONE and (run.checkpoints / "latest").exists()
    failed, healed = state.attempts[0], state.attempts[-1]
    assert (failed.cause, failed.decision) == ("signal", "restart")
    assert healed.restarted_by == "recovery" and healed.outcome == "done" and healed.lost_s is not None
    log = supervision.log_path(run).read_text()
    assert "took control" in log and "restarting (restart 1 of 2)" in log and "recovered:" in log


def test_a_console_that_asks_gets_the_run_and_the_supervisor_takes_it_back_when_it_goes(supervised_run, pool):
    run, console, sup = supervised_run(max_steps=400)
    kill_console(console)
    wait_for(lambda: holder(run) == supervision.PURPOSE, 15, "the supervisor to take the lock")
    ctrl = RunController.open(run, pool, purpose="attach")  # a new console: handed over, not refused
    try:
        assert holder(run) == "attach" and ctrl.reconcile() == "live"
        assert not supervision.handover_path(run).exists()
    finally:
        ctrl.close()
    wait_for(lambda: holder(run) == supervision.PURPOSE, 15, "the supervisor to take the run back")
    # `taehv-console stop` asks whoever holds the run: the supervisor stops it and exits STOPPED
    state = request_stop(run, pool, grace_s=20, wait_s=60)
    assert state.phase is Phase.STOPPED and state.stop.checkpoint_step is not None
    assert sup.wait(30) == 4, supervision.log_path(run).read_text()
    assert all(a.outcome in ("stopped",) for a in state.attempts)


def test_two_supervisors_of_one_run_do_not_take_it_from_each_other(supervised_run, pool):
    run, console, sup = supervised_run(max_steps=400)
    kill_console(console)
    wait_for(lambda: holder(run) == supervision.PURPOSE, 15, "the supervisor to take the lock")
    first = read_holder(run.lock_path)["pid"]
    second = start_supervisor(run, 400, 0.15)
    try:
        # the second one has started (its own "supervising RUN" line) and tried the lock for a few
        # of its 0.5 s rounds
        wait_for(
            lambda: supervision.log_path(run).read_text().count(f"supervising {run.run_id}") >= 2,
            20,
            "the second supervisor to start",
        )
        time.sleep(2.0)
        assert second.poll() is None and read_holder(run.lock_path)["pid"] == first
    finally:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait()
    request_stop(run, pool, grace_s=20, wait_s=60)
    assert sup.wait(30) == 4


def test_a_spawned_supervisor_reaches_the_nodes_the_way_its_console_does(tmp_path, monkeypatch):
    """The console's SSH settings (from --ssh-config, --known-hosts, --python, or the environment)
    reach the detached supervisor, which has no command line of its own for them."""
    from taehv_console.core.cluster.ssh import SshSettings

    monkeypatch.setenv("TAEHV_SUPERVISOR", "on")
    run = make_run(tmp_path / "runs", nodes=1, per_node=1)
    settings = SshSettings(config_path=str(tmp_path / "ssh_config"), known_hosts_path=str(tmp_path / "kh"))
    pid = supervision.spawn_supervisor(run, supervision.ssh_env(settings))
    assert pid is not None
    try:
        # read once its exec has laid out the new environment: between the exec's point of no return
        # (when Popen returns) and that, /proc/PID/environ reads empty (seen under load in CI)
        environ = wait_for(lambda: Path(f"/proc/{pid}/environ").read_bytes(), 20, "its environment").split(
            b"\0"
        )
        assert f"TAEHV_SSH_CONFIG={tmp_path / 'ssh_config'}".encode() in environ
        assert f"TAEHV_KNOWN_HOSTS={tmp_path / 'kh'}".encode() in environ
        wait_for(lambda: supervision.running_supervisor(run) is not None, 20, "its info file")
        assert supervision.spawn_supervisor(run) == pid  # one per run: a second is not started
    finally:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
