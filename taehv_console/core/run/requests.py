"""Asking for a run from any console: a stop (carried out here, or by whoever controls the run),
and its live process trees read without its lock (for `status`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.run.backends import BackendError, make_backend
from taehv_console.core.run.control import RunController
from taehv_console.core.run.lock import RunBusyError
from taehv_console.core.run.outcome import ControlError, RunSnapshot, stop_grace_s, whoami
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.run.state import RunState


def request_stop(
    run: RunDir,
    pool: SshPool,
    grace_s: float | None = None,
    wait_s: float | None = None,
    on_update: Callable[[RunSnapshot], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> RunState:
    """Stop a run from any console. If no console controls it, take the lock and stop it here;
    if one does, ask it (stop.request) and wait until the state says the run ended; should that
    console die meanwhile, take over."""
    say = say or (lambda _m: None)
    deadline = None
    while True:
        try:
            ctrl = RunController.open(run, pool, purpose="stop")
        except RunBusyError as err:
            if deadline is None:
                grace = grace_s if grace_s is not None else stop_grace_s(run.load_config())
                deadline = time.time() + (wait_s if wait_s is not None else grace + 90)
                tmp = run.stop_request_path.with_name(f".{run.stop_request_path.name}.{os.getpid()}")
                tmp.write_text(json.dumps({"time": time.time(), "by": whoami(), "grace_s": grace_s}))
                os.replace(tmp, run.stop_request_path)
                say(f"{err}\nasked it to stop the run; waiting for it")
            state = run.read_state()
            if state.phase.ended:
                return state
            if time.time() > deadline:
                raise ControlError(
                    f"{run.run_id}: the controlling console did not stop the run in time "
                    f"(state: {state.phase.value})"
                ) from None
            time.sleep(0.5)
            continue
        with ctrl:
            if ctrl.reconcile() == "ended":
                return ctrl.state
            say(f"stopping {run.run_id}")
            ctrl.stop(grace_s=grace_s, reason="user", on_update=on_update)
            run.stop_request_path.unlink(missing_ok=True)
            return ctrl.state


def probe_live(run: RunDir, pool: SshPool) -> tuple[RunState, dict[int, tuple[int, ...] | Exception]]:
    """State and live process trees of a run, without taking its lock (for `status`)."""
    state = run.read_state()
    a = state.attempt
    if a is None or a.ended is not None:
        return state, {}
    cfg = run.load_config()
    backend = make_backend(state.backend, pool, cfg.topology.nodes)
    try:
        return state, backend.processes(run, a)
    except BackendError as err:
        return state, {-1: err}
