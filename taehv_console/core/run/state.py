"""`state.json`: what the console knows about a run (phase, attempts, each node's launcher pid and
pgid and host, failure, stop) as frozen values, read and written whole and atomically.

Only the console holding the run's lock writes it; anyone may read it. Unknown keys are ignored
on read, so an older console can still show a run a newer one wrote.
"""

from __future__ import annotations

import enum
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from taehv_console.core.models import BackendKind

STATE_VERSION = 1


class Phase(str, enum.Enum):
    CREATED = "created"  # files written, nothing started
    LAUNCHING = "launching"  # node launchers being started
    RUNNING = "running"
    STOPPING = "stopping"  # SIGTERM sent, waiting for the checkpoint
    RECOVERING = "recovering"  # an attempt failed; the console relaunches it after a backoff
    STOPPED = "stopped"  # ended by a stop; resumable
    DONE = "done"  # every rank reached max_steps
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        return self in (Phase.STOPPED, Phase.DONE, Phase.FAILED)


@dataclass(frozen=True)
class NodeLauncher:
    """One node's launcher process as started: stop it by its process group, never by name."""

    index: int  # machine rank
    host: str
    pid: int
    pgid: int
    log: str
    started: float = 0.0
    # the process's start time in /proc and the node's boot id, read on the node at spawn: with the
    # run id in its environment, what proves a pid is still this launcher before any signal
    # (None / "": recorded before they were kept, or by a node helper too old to say)
    start_ticks: int | None = None
    boot_id: str = ""


@dataclass(frozen=True)
class Failure:
    """Why a run failed: the first failing node and rank, and the log lines that show it."""

    reason: str
    node: int | None = None
    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    log_lines: tuple[str, ...] = ()
    detected: float = 0.0
    # what kind of failure the diagnosis found: signal, exception, disk-full, exit, node-lost,
    # symptom (only peers' complaints), launch, stall ("" in state files written before it existed)
    kind: str = ""

    def summary(self) -> str:
        where = []
        if self.node is not None:
            where.append(f"node {self.node}" + (f" ({self.host})" if self.host else ""))
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        return (", ".join(where) + ": " if where else "") + self.reason


@dataclass(frozen=True)
class StopRecord:
    requested: float
    by: str  # "pid@host" of whoever asked
    reason: str  # "user", "signal", "failure", ...
    grace_s: float
    checkpoint_step: int | None = None  # the step every rank stopped and checkpointed at
    killed: tuple[str, ...] = ()  # "host:pgid" groups that needed SIGKILL
    verified: bool = False  # nothing of the run's process groups was left on any node
    finished: float | None = None


@dataclass(frozen=True)
class Attempt:
    """One start of the run's launchers (the first launch, then each resume)."""

    number: int
    started: float
    nodes: tuple[NodeLauncher, ...] = ()
    resume: str | None = None  # None (fresh), "latest" or a checkpoint path
    weights_only: bool = False
    ended: float | None = None
    outcome: str | None = None  # "done" | "stopped" | "failed"
    slurm_job: str | None = None
    # rank -> size of its events file when the attempt began: where this attempt's events start
    event_offsets: tuple[tuple[int, int], ...] = ()
    # -- recovery (core/run/recovery.py): how a failed attempt was judged, and what it cost
    from_step: int = 0  # the checkpoint step it resumed from (0: a fresh start)
    reached_step: int | None = None  # the last step it trained (when it ended)
    cause: str = ""  # CauseKind of its failure ("" unless it failed)
    decision: str = ""  # Action taken about it: restart, exclude, fail, give-up ("" unless it failed)
    why: str = ""  # the decision's reason, for a person
    blamed_node: int | None = None  # the node struck for the failure
    restarted_by: str = ""  # "recovery" when the console relaunched it after a failure
    restart_budget: int | None = None  # recovery.max_restarts when it was launched
    lost_s: float | None = None  # fault to training again, seconds (set on the attempt that recovered)
    last_step_at: float | None = None  # its last step's time: the fault came after (when it failed)
    detected: float | None = None  # when the console knew it had failed
    trained_at: float | None = None  # its first step (on an attempt that recovered a failed one)
    redone_steps: int | None = None  # steps trained again since the checkpoint it resumed from


@dataclass(frozen=True)
class Exclusion:
    """A node the console left out of the run, with its evidence and what took its place."""

    node: int  # its machine rank when it was left out
    host: str
    why: str  # the decision's reason: the failure and the strikes or evidence against the node
    time: float
    attempt: int  # the failed attempt that left it out
    replaced_by: str | None = None  # the spare host now at that machine rank (None: no spare)
    nodes_before: int = 0
    nodes_after: int = 0
    changes: tuple[str, ...] = ()  # config changes for the new topology, each with its reason
    checkpoint: str | None = None  # the checkpoint converted for the new world size


@dataclass(frozen=True)
class RunState:
    run_id: str
    phase: Phase
    backend: BackendKind  # state.json holds its value; a str given here is taken as that value
    hosts: tuple[str, ...]  # one per node, machine-rank order
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    created: float = 0.0
    updated: float = 0.0
    attempts: tuple[Attempt, ...] = ()
    failure: Failure | None = None
    stop: StopRecord | None = None
    # extra environment for every node's launcher (--env), kept so a resume uses it again
    env: tuple[tuple[str, str], ...] = ()
    # nodes this console starts and signals (platform: only its own node)
    controlled: tuple[int, ...] = ()
    # hosts that may take a left-out node's place (--spares), and the nodes left out so far
    spares: tuple[str, ...] = ()
    exclusions: tuple[Exclusion, ...] = ()
    # what a person must look at: a recorded process the console could not prove was the run's,
    # so it sent it no signal (node, pid and why), one line each
    attention: tuple[str, ...] = ()
    version: int = STATE_VERSION

    def __post_init__(self) -> None:
        # an unknown kind (a hand-edited or newer state.json) is a ValueError, which read_state
        # turns into a StateError naming the file
        object.__setattr__(self, "backend", BackendKind(self.backend))

    @property
    def attempt(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def with_attempt(self, attempt: Attempt) -> RunState:
        """This state with its current attempt replaced (or the first one added)."""
        attempts = (
            self.attempts[:-1] + (attempt,)
            if self.attempts and self.attempts[-1].number == attempt.number
            else self.attempts + (attempt,)
        )
        return replace(self, attempts=attempts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["phase"] = self.phase.value
        d["backend"] = self.backend.value
        d["env"] = dict(self.env)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        kw = _known(cls, data)
        kw["phase"] = Phase(kw.get("phase", "created"))
        kw["hosts"] = tuple(kw.get("hosts", ()))
        kw["controlled"] = tuple(kw.get("controlled", ()))
        kw["spares"] = tuple(kw.get("spares", ()))
        kw["attention"] = tuple(kw.get("attention", ()))
        kw["exclusions"] = tuple(
            Exclusion(**{**_known(Exclusion, e), "changes": tuple(e.get("changes", ()))})
            for e in kw.get("exclusions", ())
        )
        kw["env"] = tuple(sorted((str(k), str(v)) for k, v in (kw.get("env") or {}).items()))
        kw["attempts"] = tuple(
            Attempt(
                **{
                    **_known(Attempt, a),
                    "nodes": tuple(NodeLauncher(**_known(NodeLauncher, n)) for n in a.get("nodes", ())),
                    "event_offsets": tuple((int(r), int(o)) for r, o in a.get("event_offsets", ())),
                }
            )
            for a in kw.get("attempts", ())
        )
        if kw.get("failure"):
            f = _known(Failure, kw["failure"])
            kw["failure"] = Failure(**{**f, "log_lines": tuple(f.get("log_lines", ()))})
        if kw.get("stop"):
            s = _known(StopRecord, kw["stop"])
            kw["stop"] = StopRecord(**{**s, "killed": tuple(s.get("killed", ()))})
        return cls(**kw)


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


class StateError(RuntimeError):
    """state.json is missing or unreadable; the message names the file."""


def write_state(path: Path, state: RunState) -> RunState:
    """Write atomically (temp file in the same directory, fsync, os.replace): a reader on any node
    sees the old state or the new one, never half of one. Returns the state with `updated` set."""
    state = replace(state, updated=time.time())
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state.to_dict(), f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return state


def read_state(path: Path) -> RunState:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StateError(f"{path}: no state file (the run was never launched by a console)") from None
    except (OSError, json.JSONDecodeError) as err:
        raise StateError(f"{path}: unreadable ({err})") from None
    try:
        return RunState.from_dict(data)
    except (TypeError, ValueError) as err:
        raise StateError(f"{path}: not a run state this console understands ({err})") from None


# ----------------------------------------------------------------------------- node status files


@dataclass(frozen=True)
class NodeStatus:
    """What a node's launcher wrapper wrote about itself (`logs/node-<i>.status.json`): who it is
    (pid, process start time, boot id, so a reused pid is never taken for it) and, once the
    launcher has exited, its exit code."""

    node: int
    attempt: int
    pid: int
    pgid: int
    hostname: str = ""
    start_ticks: int | None = None
    boot_id: str = ""
    started: float = 0.0
    exit_code: int | None = None  # negative: killed by that signal
    ended: float | None = None
    argv: tuple[str, ...] = field(default=())
    slurm_step: str = ""  # JOBID.STEPID when srun started this wrapper as one task of a step

    @property
    def exited(self) -> bool:
        return self.exit_code is not None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeStatus:
        kw = _known(cls, data)
        kw["argv"] = tuple(kw.get("argv", ()))
        return cls(**kw)


def read_node_status(path: Path) -> NodeStatus | None:
    """The status file, or None when it is absent or being replaced (callers poll again)."""
    try:
        return NodeStatus.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, TypeError):
        return None
