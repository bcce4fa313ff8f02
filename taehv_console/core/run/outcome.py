"""What run control says and returns: its errors, the snapshots a front end renders, how a run
ended (Outcome), where a resume starts, and the pure verdict on an attempt from its ranks' `stop`
events."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from taehv_console.core.run.recovery import Action
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.run.state import Failure, Phase, RunState, StopRecord
from trainer.config import TrainConfig

DEFAULT_GRACE_S = 120.0


class ControlError(RuntimeError):
    """A control action cannot be done; the message says why and what to do instead."""


class RunLiveError(ControlError):
    """The run's processes are alive: a launch or resume would start it twice."""


class NothingToResumeError(ControlError):
    pass


class WorldSizeChangedError(ControlError):
    pass


class LaunchError(ControlError):
    pass


class AllocationTooSmallError(ControlError):
    """A SLURM run launched inside an allocation with fewer nodes than the run has: nothing starts."""


def stop_grace_s(cfg: TrainConfig) -> float:
    """How long a stop waits for the checkpoint before SIGKILL: the config's schedule.stop_grace_s."""
    return float(cfg.schedule.stop_grace_s or DEFAULT_GRACE_S)


def whoami() -> str:
    """pid@host: who asked, in stop records and requests."""
    return f"{os.getpid()}@{socket.gethostname()}"


def verdict(stops: Mapping[int, Mapping[str, Any]], watched: Iterable[int], stop_requested: bool) -> Phase:
    """How an attempt ended, from the `stop` events its watched ranks wrote (rank -> event) and
    whether this console asked it to stop. Every rank said `done`: DONE (even mid-stop: it finished
    first); any rank stopped with an error: FAILED; every rank stopped, or a stop was asked: STOPPED;
    otherwise some rank ended without a word: FAILED."""
    watched = set(watched)
    mine = {r: e for r, e in stops.items() if r in watched}
    reported = watched <= set(mine)
    reasons = {str(e.get("reason")) for e in mine.values()}
    if reported and reasons == {"done"}:
        return Phase.DONE
    if "error" in reasons:
        return Phase.FAILED
    if reported or stop_requested:
        return Phase.STOPPED
    return Phase.FAILED


def stop_step(stops: Mapping[int, Mapping[str, Any]], watched: Iterable[int]) -> int | None:
    """The step every watched rank stopped (and checkpointed) at; None unless they all said and agree."""
    watched = set(watched)
    mine = [e for r, e in stops.items() if r in watched]
    if not watched <= set(stops) or {str(e.get("reason")) for e in mine} - {"signal", "done"}:
        return None
    steps = {e.get("step") for e in mine}
    return steps.pop() if len(steps) == 1 else None


@dataclass(frozen=True)
class RunSnapshot:
    """What a front end shows: phase, attempt, progress numbers, the events new since the last
    snapshot, and console notes (stop sent, node killed ...)."""

    run_id: str
    phase: Phase
    attempt: int
    progress: Mapping[str, Any]
    events: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    failure: Failure | None = None


@dataclass(frozen=True)
class Outcome:
    phase: Phase
    failure: Failure | None
    stop: StopRecord | None
    progress: Mapping[str, Any]
    final_weights: str | None = None
    # failed in a way another try would repeat, or the console's restarts gave up: do not requeue
    final: bool = False


@dataclass(frozen=True)
class ResumePoint:
    spec: str  # "latest" or a checkpoint path, as taehv-train takes it
    step: int
    path: str
    world_size: int | None
    skipped: tuple[str, ...] = ()


# what a failed attempt's recovery decided when the run goes on: another attempt follows
_GOES_ON = (Action.RESTART.value, Action.EXCLUDE.value)


def judge_pending(state: RunState) -> bool:
    """The run failed and nobody judged the failure yet: it failed while no console or supervisor
    followed it, and whoever adopts it decides now."""
    a = state.attempt
    return state.phase is Phase.FAILED and a is not None and not a.decision and state.failure is not None


def settled(state: RunState) -> bool:
    """The run has ended for good: ended, its failure judged, and no restart decided."""
    a = state.attempt
    if not state.phase.ended or judge_pending(state):
        return False
    return a is None or a.decision not in _GOES_ON


def outcome_of(run: RunDir, state: RunState, progress: Mapping[str, Any]) -> Outcome:
    """How the run stands, as state.json and its events (`progress`) say."""
    a = state.attempt
    return Outcome(
        phase=state.phase,
        failure=state.failure,
        stop=state.stop,
        progress=progress,
        final_weights=str(run.final_weights) if run.final_weights.is_file() else None,
        final=state.phase is Phase.FAILED
        and a is not None
        and a.decision in (Action.FAIL.value, Action.GIVE_UP.value),
    )
