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
from taehv_console.core.run.outcome import ControlError, RunSnapshot, settled, stop_grace_s, whoami
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.run.state import RunState


def write_stop_request(run: RunDir, grace_s: float | None = None, hurry: bool = False) -> None:
    """Ask whoever controls the run to stop it (RUN/stop.request); `hurry` (a second Ctrl-C) cuts
    a stop in progress short of its grace."""
    tmp = run.stop_request_path.with_name(f".{run.stop_request_path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"time": time.time(), "by": whoami(), "grace_s": grace_s, "hurry": hurry}))
    os.replace(tmp, run.stop_request_path)


def request_stop(
    run: RunDir,
    pool: SshPool,
    grace_s: float | None = None,
    wait_s: float | None = None,
    on_update: Callable[[RunSnapshot], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> RunState:
    """Stop a run from any console. If nobody controls it, take the lock and stop it here; if a
    console or the run's supervisor does, ask it (stop.request) and wait until the state says the
    run ended; should it die meanwhile, take over."""
    say = say or (lambda _m: None)
    deadline = None
    while True:
        try:
            ctrl = RunController.open(run, pool, purpose="stop", handover=False)
        except RunBusyError as err:
            if deadline is None:
                grace = grace_s if grace_s is not None else stop_grace_s(run.load_config())
                deadline = time.time() + (wait_s if wait_s is not None else grace + 90)
                write_stop_request(run, grace_s)
                say(f"{err}\nasked it to stop the run; waiting for it")
            state = run.read_state()
            if settled(state):  # not a failure whose restart is decided: that one ends stopped
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
                if on_update:  # what reconciling found (a recorded pid that is not the run's ...)
                    on_update(ctrl.snapshot())
                return ctrl.state
            say(f"stopping {run.run_id}")
            ctrl.stop(grace_s=grace_s, reason="user", on_update=on_update)
            run.stop_request_path.unlink(missing_ok=True)
            return ctrl.state


def probe_live(
    run: RunDir, pool: SshPool, refused: dict[int, str] | None = None
) -> tuple[RunState, dict[int, tuple[int, ...] | Exception]]:
    """State and live process trees of a run, without taking its lock (for `status`); nothing is
    written. A recorded group whose identity its node could not prove is not listed: `refused`,
    when given, gets node -> why."""
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
    finally:
        if refused is not None:
            refused.update(backend.take_refusals())
