"""The console end to end on this machine, driven by Pilot: the wizard with the cpu-smoke preset
launches a real local DeepSpeed run on generated clips; the dashboard sees steps advance; a stop
(confirmed) writes a checkpoint; resume continues from it; drill-down and back; theme switch.
One real run for the whole flow: it is the slow part (about 20 s to start on two CPU cores)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from taehv_console.ui import messages
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

    run = RunDir(Path(run_path))
    if run.has_state() and not run.read_state().phase.ended:
        with SshPool() as pool:
            request_stop(run, pool, grace_s=5)


def test_wizard_launches_stops_resumes_a_real_cpu_run(tmp_path):
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
        "--env",
        "OMP_NUM_THREADS=1",
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
            # no live run under --runs: the wizard opens and detects this machine
            await wait_for(
                pilot, lambda: screen_is(app, "DetectScreen") and app.wizard.topology, 60, "detection"
            )
            assert app.wizard.topology.source.value == "local"
            await pilot.press("n")
            await wait_for(pilot, lambda: app.wizard.preflight, 120, "preflight")
            assert app.wizard.preflight.report.ok, app.wizard.preflight.report.findings
            assert (
                "cpu-smoke" in app.wizard.preflight.chosen
                and "generated clips" in app.wizard.preflight.chosen
            )
            await pilot.press("n")
            await wait_for(pilot, lambda: screen_is(app, "PresetScreen"), 30, "preset screen")
            await app.workers.wait_for_complete()
            await pilot.pause()
            await pilot.press("n")
            await wait_for(pilot, lambda: screen_is(app, "ReviewScreen"), 60, "review")
            review = app.wizard.review
            assert not review.blocked and review.config.optim.max_steps == 1000
            await pilot.press("s")

            await wait_for(pilot, lambda: screen_is(app, "DashboardScreen"), 60, "dashboard")
            launched = await wait_for(
                pilot,
                lambda: next((m for m in seen if isinstance(m, messages.RunAttached)), None),
                30,
                "launch",
            )
            run_path = launched.run_path
            assert launched.how == "launched" and run_path == review.run_path  # the id the review showed
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
