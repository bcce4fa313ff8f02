"""Issue 13, hole 5: the console killed between starting the launchers and recording them. The
next console adopts the node wrappers from their status files: the run is live (not failed), a
second launch is refused, and following it ends it properly. Real processes (the fake launcher)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taehv_console.core.run.control import RunController
from taehv_console.core.run.outcome import RunLiveError
from taehv_console.core.run.state import Phase
from tests.core.run.conftest import step_of, wait_for


def test_launchers_started_but_never_recorded_are_adopted(launch_fake, pool):
    first = launch_fake(nodes=2, max_steps=30, step_s=0.2)
    run = first.run
    wait_for(lambda: step_of(first) >= 1, 30, "a step")
    started = first.attempt
    # what state.json holds when the console dies right after backend.start(): no launchers yet
    first._save(replace(first.state.with_attempt(replace(started, nodes=())), phase=Phase.LAUNCHING))
    first.close()

    ctrl = RunController.open(run, pool, purpose="the next console")
    try:
        assert ctrl.reconcile() == "live"  # not concluded as failed while it trains
        adopted = {n.index: n.pgid for n in ctrl.attempt.nodes}
        assert adopted == {n.index: n.pgid for n in started.nodes}
        with pytest.raises(RunLiveError, match="attach"):
            ctrl.launch()
        outcome = ctrl.follow(interval=0.1)
        assert outcome.phase is Phase.DONE
        assert len(run.read_state().attempts) == 1  # never launched twice
    finally:
        ctrl.close()
