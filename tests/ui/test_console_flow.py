"""The console end to end on this machine, driven by Pilot: the wizard with the cpu-smoke preset
launches a real local DeepSpeed run on generated clips; the dashboard sees steps advance; a stop
(confirmed) writes a checkpoint; resume continues from it; drill-down and back; theme switch.
One real run for the whole flow: it is the slow part (about 20 s to start on two CPU cores)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from taehv_console.core.run.lock import read_holder
from taehv_console.ui import messages
from tests.e2e.consoles import SMALL_RUN
from tests.ui.conftest import sample_app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def wait_for(pilot, predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await pilot.pause(0.2)
    app = pilot.app
    raise AssertionError(
        f"timed out after {timeout} s waiting for {what}; screen {type(app.screen).__name__}, "
        f"console phase {app.console_phase}, notes {app.notes[-5:]}"
    )


def screen_is(app, name: str) -> bool:
    return type(app.screen).__name__ == name


def step_of(app) -> int:
    s = app.cluster_state
    return s.run.step if s is not None and s.run.step is not None else -1


def _stop_leftovers(run_path: str | None) -> None:
    """Whatever this test left running is stopped through core (by recorded process group)."""
    if not run_path:
        return
    from taehv_console.core.cluster.ssh import SshPool
    from taehv_console.core.run.requests import request_stop
    from taehv_console.core.run.rundir import RunDir
    from taehv_console.core.run.supervision import running_supervisor

    run = RunDir(Path(run_path))
    if run.has_state() and not run.read_state().phase.ended:
        with SshPool() as pool:
            request_stop(run, pool, grace_s=5)
    # the run's supervisor carries the stop out and then exits: wait for it, so that nothing of the
    # test outlives it (the reaper found one still up on a loaded machine)
    deadline = time.monotonic() + 120
    while running_supervisor(run) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert running_supervisor(run) is None, "the run's supervisor did not exit within 120 s of the stop"


async def launch_from_the_wizard(pilot, app, seen: list[object]):
    """The wizard as a new user walks it on this machine (detect, preflight, preset, review, start):
    (the run's path, the review) once the dashboard has attached to the launched run."""
    # no live run under --runs: the wizard opens and detects this machine
    await wait_for(pilot, lambda: screen_is(app, "DetectScreen") and app.wizard.topology, 60, "detection")
    assert app.wizard.topology.source.value == "local"
    await pilot.press("n")
    await wait_for(pilot, lambda: app.wizard.preflight, 120, "preflight")
    assert app.wizard.preflight.report.ok, app.wizard.preflight.report.findings
    assert "cpu-smoke" in app.wizard.preflight.chosen and "generated clips" in app.wizard.preflight.chosen
    await pilot.press("n")
    await wait_for(pilot, lambda: screen_is(app, "PresetScreen"), 30, "preset screen")
    await app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.press("n")
    await wait_for(pilot, lambda: screen_is(app, "ReviewScreen"), 60, "review")
    review = app.wizard.review
    assert not review.blocked
    await pilot.press("s")
    await wait_for(pilot, lambda: screen_is(app, "DashboardScreen"), 60, "dashboard")
    launched = await wait_for(
        pilot,
        lambda: next((m for m in seen if isinstance(m, messages.RunAttached)), None),
        30,
        "launch",
    )
    assert launched.how == "launched" and launched.run_path == review.run_path  # the id the review showed
    return launched.run_path, review


def test_wizard_launches_stops_resumes_a_real_cpu_run(tmp_path, monkeypatch):
    """As users run it: the launch hands the run to its supervisor, the console is its client (its
    stop a request the supervisor carries out; its resume takes the lock for the launch only)."""
    monkeypatch.setenv("TAEHV_SUPERVISOR", "on")
    asyncio.run(_flow(tmp_path))


async def _flow(tmp_path) -> None:
    seen: list[object] = []

    def hook(message) -> None:
        if isinstance(message, (messages.RunAttached, messages.RunEnded, messages.ControlFailed)):
            seen.append(message)

    app = sample_app(
        "--runs",
        str(tmp_path / "runs"),
        "--grace",
        "90",
        *SMALL_RUN,
        "--set",
        "optim.max_steps=1000",
        "--set",
        "schedule.val_every=1000",
        "--set",
        "schedule.checkpoint_every=1000",
        startup="auto",
    )
    run_path = None
    try:
        async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
            run_path, review = await launch_from_the_wizard(pilot, app, seen)
            assert review.config.optim.max_steps == 1000
            assert app.session.client is not None and app.session.ctrl is None
            await wait_for(pilot, lambda: step_of(app) >= 1, 240, "the first steps")
            first = step_of(app)
            await wait_for(pilot, lambda: step_of(app) > first, 120, "steps advancing")

            # drill down into the node and back
            await pilot.press("enter")
            await wait_for(pilot, lambda: screen_is(app, "NodeScreen"), 10, "node screen")
            await wait_for(pilot, lambda: app.screen._lines, 30, "the node's log")
            await pilot.press("escape")
            await wait_for(pilot, lambda: screen_is(app, "DashboardScreen"), 10, "back on the dashboard")

            # theme switch
            before = app.theme
            await pilot.press("t")
            assert app.theme != before and app.theme in app.theme_names

            # stop: asks first; no means nothing happens
            await pilot.press("x")
            await wait_for(pilot, lambda: screen_is(app, "ConfirmScreen"), 10, "confirmation")
            await pilot.press("n")
            assert app.session.following
            await pilot.press("x")
            await wait_for(pilot, lambda: screen_is(app, "ConfirmScreen"), 10, "confirmation")
            await pilot.press("y")
            ended = await wait_for(
                pilot,
                lambda: next((m for m in seen if isinstance(m, messages.RunEnded)), None),
                180,
                "the stop",
            )
            assert ended.outcome.phase.value == "stopped", ended.outcome
            stopped_at = ended.outcome.stop.checkpoint_step
            assert stopped_at is not None and stopped_at >= 1
            from trainer import checkpoint as ckpt

            newest = ckpt.scan(Path(run_path) / "checkpoints").newest
            assert newest is not None and newest.step == stopped_at

            # resume: steps continue past the checkpoint
            await pilot.press("r")
            await wait_for(
                pilot, lambda: sum(isinstance(m, messages.RunAttached) for m in seen) >= 2, 60, "resume"
            )
            assert [m.how for m in seen if isinstance(m, messages.RunAttached)] == ["launched", "resumed"]
            assert app.session.client is not None  # handed to a supervisor again
            await wait_for(
                pilot, lambda: read_holder(Path(run_path) / "lock").get("purpose") == "supervise", 30, "it"
            )
            await wait_for(pilot, lambda: step_of(app) > stopped_at, 240, "steps after the resume")

            # leave as the test found it: stop again, then quit the console only
            await pilot.press("x")
            await wait_for(pilot, lambda: screen_is(app, "ConfirmScreen"), 10, "confirmation")
            await pilot.press("y")
            await wait_for(
                pilot, lambda: sum(isinstance(m, messages.RunEnded) for m in seen) >= 2, 180, "stop 2"
            )
            await pilot.press("q")
        assert not any(isinstance(m, messages.ControlFailed) for m in seen), seen
    finally:
        _stop_leftovers(run_path)


def test_the_tui_quit_in_the_middle_of_a_kill_9_the_run_still_recovers(tmp_path, monkeypatch):
    """Issue 20's case: a rank dies and the user quits the TUI while the console is on it. The
    supervisor the launch started takes the run back and heals it, with every window closed."""
    monkeypatch.setenv("TAEHV_SUPERVISOR", "on")
    asyncio.run(_quit_mid_kill(tmp_path))


async def _quit_mid_kill(tmp_path) -> None:
    seen: list[object] = []
    app = sample_app(
        "--runs",
        str(tmp_path / "runs"),
        *SMALL_RUN,
        "--set",
        # 18 steps after step 6 as the window shows it (its watch trails the run by a poll)
        "optim.max_steps=24",
        "--set",
        "schedule.val_every=1000",
        "--set",
        "schedule.checkpoint_every=4",
        "--set",
        "recovery.backoff_s=1",
        startup="auto",
    )
    run_path = None
    try:
        async with app.run_test(size=(120, 40), message_hook=seen.append) as pilot:
            run_path, _review = await launch_from_the_wizard(pilot, app, seen)
            await wait_for(pilot, lambda: step_of(app) >= 6, 300, "step 6, after the checkpoint at step 4")
            run = Path(run_path)
            assert (run / "supervisor.json").is_file()  # the launch started one
            # this window is the supervisor's client: the supervisor holds the run's lock
            assert read_holder(run / "lock").get("purpose") == "supervise"
            victim = json.loads((run / "heartbeat" / "rank-1.json").read_text())["pid"]
            os.kill(victim, signal.SIGKILL)
            await pilot.pause(1.0)  # the console is on it: its watch has seen the rank go
            await pilot.press("q")
        run = Path(run_path)
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and json.loads((run / "state.json").read_text())["phase"] != "done":
            await asyncio.sleep(1)
        # the supervisor records the verdict, stops its watch, then logs that the run ended: the
        # line can trail state.json by seconds on a loaded machine
        ended = f"{run.name} ended: done"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and ended not in (run / "supervisor.log").read_text():
            await asyncio.sleep(0.5)
        state = json.loads((run / "state.json").read_text())
        log = (run / "supervisor.log").read_text()
        assert state["phase"] == "done", log[-3000:]
        assert (run / "final" / "taehv.safetensors").is_file()
        assert [a["decision"] for a in state["attempts"]] == ["restart", ""], state["attempts"]
        assert state["attempts"][-1]["restarted_by"] == "recovery"
        # After the quit the supervisor owns the run and carries it to the end, whichever step of the
        # recovery the console had reached when its window closed (a matter of timing: CI has seen
        # the supervisor restart the failed attempt, and take over one the console had restarted)
        assert ended in log, log
    finally:
        _stop_leftovers(run_path)
