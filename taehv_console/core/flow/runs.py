"""Which runs exist and which one is live: the single definition every front end uses (the TUI's
start-up and run picker, `--no-tui` before launching, `status`, `stop` and `attach`).

A run is live when its state has not ended and some process of its current attempt is alive on
its nodes, or a node could not be asked (unknown counts as alive: never launch twice on a maybe)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.run.requests import probe_live
from taehv_console.core.run.rundir import RunDir, list_runs, resolve_run
from taehv_console.core.run.state import StateError

Processes = Mapping[int, "tuple[int, ...] | Exception"]


def any_alive(procs: Processes) -> bool:
    """Some node still has processes of the attempt, or could not be asked."""
    return any(isinstance(p, Exception) or p for p in procs.values())


@dataclass(frozen=True)
class RunEntry:
    run_id: str
    path: str
    phase: str  # state.json's phase, "unreadable: ...", or "no state"
    live: bool
    hosts: tuple[str, ...] = ()


def run_entry(run: RunDir, pool: SshPool) -> RunEntry:
    """One run's phase and liveness, asking its nodes (without taking its lock). A damaged run
    (state.json or run.toml; ConfigError is a ValueError) is "unreadable: <why>", never live."""
    if not run.has_state() and not run.lost_state():
        return RunEntry(run.run_id, str(run.path), "no state", False)
    try:
        state, procs = probe_live(run, pool)
    except (StateError, OSError, ValueError) as err:
        return RunEntry(run.run_id, str(run.path), f"unreadable: {err}"[:300], False)
    live = not state.phase.ended and any_alive(procs)
    return RunEntry(run.run_id, str(run.path), state.phase.value, live, tuple(state.hosts))


def list_run_entries(runs_dir: str, pool: SshPool, limit: int = 30) -> tuple[RunEntry, ...]:
    """Runs under runs_dir, newest first, each with its phase and whether it is live."""
    return tuple(run_entry(run, pool) for run in list_runs(runs_dir)[:limit])


def find_live_run(
    runs_dir: str,
    pool: SshPool,
    hosts: tuple[str, ...] | None = None,
    limit: int = 20,
    on_skip: Callable[[str], None] | None = None,
) -> RunEntry | None:
    """The newest live run under runs_dir (on exactly these `hosts` when given): the run a console
    attaches to instead of starting another on busy machines. A damaged run is passed over, with
    a one-line note to `on_skip`."""
    for run in list_runs(runs_dir)[:limit]:
        entry = run_entry(run, pool)
        if entry.phase.startswith("unreadable") and on_skip:
            on_skip(f"skipping {entry.run_id}: {entry.phase}")
        if entry.live and (hosts is None or entry.hosts == hosts):
            return entry
    return None


def newest_unended_run(
    run_ref: str | None, runs_dir: str, on_skip: Callable[[str], None] | None = None
) -> RunDir:
    """RUN as given, else the newest run whose state has not ended, else the newest run (what
    `stop` and `attach` act on without naming one). A damaged run is passed over with a one-line
    note to `on_skip` (it is the answer only when every run is damaged, so the command names it).
    RunNotFoundError when there is none."""
    if run_ref:
        return resolve_run(run_ref, runs_dir)
    readable = None  # the newest run that is not damaged: what is shown when every run has ended
    for run in list_runs(runs_dir):
        try:
            if (run.has_state() or run.lost_state()) and not run.read_state().phase.ended:
                return run
        except StateError as err:
            if on_skip:
                on_skip(f"skipping {run.run_id}: {err}")
            continue
        readable = readable or run
    return readable or resolve_run(None, runs_dir)
