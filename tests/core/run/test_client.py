"""A console as the client of the run's supervisor (core/run/client.py), on real processes: fake
torchrun launchers, the real supervisor loop in a process of its own. The client follows the run
without ever holding its lock, shows the supervisor's notes, has its stop carried out by the
supervisor, and starts a new supervisor when the one it followed is killed."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from taehv_console.commands.status import _print_one, run_info
from taehv_console.core.run import supervision
from taehv_console.core.run.client import RunClient, supervised_client
from taehv_console.core.run.outcome import RunSnapshot
from taehv_console.core.run.requests import request_stop
from taehv_console.core.run.state import Phase
from tests.core.run.conftest import alive, holder, kill_console, rank_pid, wait_for

pytestmark = pytest.mark.timeout(180)


def _follow(
    client: RunClient, stop: threading.Event
) -> tuple[threading.Thread, dict, list[RunSnapshot], set]:
    result: dict = {}
    snaps: list[RunSnapshot] = []
    holders: set[str] = set()

    def update(snap: RunSnapshot) -> None:
        snaps.append(snap)
        holders.add(holder(client.run))

    def run() -> None:
        try:
            result["outcome"] = client.follow(update, should_stop=stop.is_set, interval=0.1)
        except Exception as err:  # noqa: BLE001 - the test reads it
            result["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result, snaps, holders


def _notes(snaps: list[RunSnapshot]) -> list[str]:
    return [n for s in snaps for n in s.notes]


def test_a_client_follows_the_supervised_run_through_a_restart_and_its_stop_is_the_supervisors(
    supervised_run, pool, monkeypatch
):
    monkeypatch.setenv("TAEHV_SUPERVISOR", "on")
    run, console, sup = supervised_run(max_steps=400)
    kill_console(console)
    wait_for(lambda: holder(run) == supervision.PURPOSE, 15, "the supervisor to take the lock")
    client = supervised_client(run, pool)
    assert client is not None
    stop = threading.Event()
    thread, result, snaps, holders = _follow(client, stop)
    wait_for(lambda: (run.checkpoints / "step-3").is_dir(), 60, "the first checkpoint")
    os.kill(rank_pid(run, 1), signal.SIGKILL)
    wait_for(lambda: any(n.startswith("recovered:") for n in _notes(snaps)), 90, "the supervisor's recovery")
    stop.set()
    thread.join(90)
    assert "error" not in result, result
    outcome = result["outcome"]
    assert outcome.phase is Phase.STOPPED and outcome.stop.checkpoint_step is not None
    # the supervisor held the run throughout (free only once it had ended): following never took it
    assert supervision.PURPOSE in holders and holders <= {supervision.PURPOSE, ""}, holders
    notes = _notes(snaps)
    assert any("restarting (restart 1 of 2)" in n for n in notes), notes
    assert "stop asked of the run's supervisor" in notes
    assert max(s.attempt for s in snaps) == 2
    assert sup.wait(30) == 4, supervision.log_path(run).read_text()
    assert not run.stop_request_path.exists()


def test_a_client_whose_supervisor_is_killed_starts_another_which_adopts_the_run(
    supervised_run, pool, monkeypatch
):
    monkeypatch.setenv("TAEHV_SUPERVISOR", "on")
    run, console, sup = supervised_run(max_steps=60, step_s=0.15)
    kill_console(console)
    wait_for(lambda: holder(run) == supervision.PURPOSE, 15, "the supervisor to take the lock")
    client = supervised_client(run, pool)
    assert client is not None
    thread, result, snaps, _ = _follow(client, threading.Event())
    first = sup.pid
    os.killpg(sup.pid, signal.SIGKILL)
    sup.wait()
    info = wait_for(
        lambda: (i := supervision.running_supervisor(run)) is not None and i["pid"] != first and i,
        30,
        "a new supervisor",
    )
    try:
        thread.join(120)
        assert "error" not in result, result
        assert result["outcome"].phase is Phase.DONE, supervision.log_path(run).read_text()[-2000:]
        notes = _notes(snaps)
        assert any(n.startswith("the run's supervisor was gone: started another") for n in notes), notes
        assert any("took control" in n for n in notes), notes
        assert run.read_state().attempts[-1].outcome == "done"
    finally:
        # the run is done: the new supervisor exits by itself once it has written the outcome (it
        # is no child of this process, so it is polled); only one still there after that is ended
        deadline = time.monotonic() + 30
        while alive(info["pid"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(info["pid"]):
            os.killpg(info["pid"], signal.SIGKILL)


def test_a_clients_hurry_cuts_the_controllers_stop_short_of_its_grace(launch_fake, pool):
    """Ranks that ignore SIGTERM hold a stop for its whole grace (60 s here). A second Ctrl-C in a
    client rewrites stop.request with `hurry`, and the controller doing the stop (the supervisor)
    SIGKILLs what is left at once."""
    ctrl = launch_fake(nodes=1, per_node=1, env={"FAKE_IGNORE_TERM": "1"}, grace_s=60.0)
    rank_pid(ctrl.run, 0)  # running
    client = RunClient(ctrl.run, pool, grace_s=60.0)
    client.request_stop()
    assert '"hurry": false' in ctrl.run.stop_request_path.read_text()
    done: dict = {}
    t0 = time.monotonic()
    thread = threading.Thread(target=lambda: done.update(record=ctrl.stop(grace_s=60.0)), daemon=True)
    thread.start()
    time.sleep(2.0)
    assert thread.is_alive()  # waiting on the ranks that ignore SIGTERM
    client.request_stop(hurry=True)
    thread.join(30)
    took = time.monotonic() - t0
    assert not thread.is_alive() and took < 30, took
    record = done["record"]
    assert record.killed and record.verified, record


def test_status_names_the_supervisor_and_warns_of_a_run_that_goes_on_without_one(
    supervised_run, pool, capsys
):
    run, console, sup = supervised_run(max_steps=400)
    kill_console(console)
    wait_for(lambda: holder(run) == supervision.PURPOSE, 15, "the supervisor to take the lock")
    info = run_info(run, pool, check=False, brief=True)
    assert info["supervisor"]["pid"] == sup.pid and info["settled"] is False
    _print_one(info)
    out = capsys.readouterr().out
    assert f"supervisor pid {sup.pid}" in out and "controlled by console" not in out
    os.killpg(sup.pid, signal.SIGKILL)  # nobody heals the run now
    sup.wait()
    info = run_info(run, pool, check=False, brief=True)
    assert info["supervisor"] is None
    _print_one(info)
    assert "no supervisor runs for it" in capsys.readouterr().out
    state = request_stop(run, pool, grace_s=10, wait_s=60)  # nobody controls it: stopped here
    assert state.phase is Phase.STOPPED
    assert run_info(run, pool, check=False, brief=True)["settled"] is True
