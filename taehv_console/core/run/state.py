"""`state.json`: what the console knows about a run (phase, attempts, each node's launcher pid and
pgid and host, failure, stop) as frozen values, read and written whole and atomically.

Only the console holding the run's lock writes it; anyone may read it. Unknown keys are ignored
on read, so an older console can still show a run a newer one wrote.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from taehv_console.core.models import BackendKind

if TYPE_CHECKING:
    from taehv_console.core.cluster.ssh.calls import DetachedProcess

STATE_VERSION = 1


class StateError(RuntimeError):
    """state.json is missing, unreadable or damaged; the message names the file (and the field)."""


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

    @classmethod
    def from_spawn(cls, index: int, host: str, p: DetachedProcess) -> NodeLauncher:
        """The launcher a spawn just started, stamped now, with the identity the node read at spawn."""
        return cls(
            index=index,
            host=host,
            pid=p.pid,
            pgid=p.pgid,
            log=p.log,
            started=time.time(),
            start_ticks=p.start_ticks,
            boot_id=p.boot_id,
        )


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
    def from_dict(cls, data: Any, where: str = "state.json") -> RunState:
        """The state a file holds, its shape checked once, here: a damaged file (a field of the
        wrong type, an array where the object belongs) is a StateError naming `where` and the
        field, never a value that breaks a reader later. Unknown keys are ignored."""
        if not isinstance(data, dict):
            raise StateError(
                f"{where}: damaged: a JSON {_json_kind(data)} where a run state (an object) belongs"
            )
        data = {"phase": "created", "hosts": (), **data}  # the defaults older writers relied on
        env = data.get("env")
        if env is None:
            data["env"] = ()
        elif isinstance(env, dict):  # written as an object, held as sorted pairs
            data["env"] = tuple(sorted((k, v) for k, v in env.items()))
        for key in ("failure", "stop"):  # {} was written for "none" by some versions
            if data.get(key) == {}:
                data[key] = None
        try:
            return _state_adapter().validate_python(data)
        except ValidationError as err:
            raise StateError(f"{where}: damaged: {validation_text(err)}") from None


def validation_text(err: ValidationError, limit: int = 3) -> str:
    """The first problems of a ValidationError as `field a.0.b: message`, joined by "; "."""
    parts = []
    for e in err.errors()[:limit]:
        loc = ".".join(str(x) for x in e["loc"]) or "(top)"
        msg = e["msg"].replace("a valid tuple", "an array").replace("a valid dictionary", "an object")
        parts.append(f"field {loc}: {msg}" + (f" (got {_short(e.get('input'))})" if "input" in e else ""))
    more = err.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_kind(value: Any) -> str:
    return {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(value), "null" if value is None else type(value).__name__
    )


@functools.cache
def _state_adapter() -> TypeAdapter[RunState]:
    # built on first use (tens of ms), once: the dataclasses above are the schema
    return TypeAdapter(RunState)


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
    """The run's state, read and checked (RunState.from_dict); StateError names the file and what
    is wrong: missing, unreadable, not JSON (truncated, binary), or JSON of the wrong shape."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise StateError(f"{path}: no state file (the run was never launched by a console)") from None
    except OSError as err:
        raise StateError(f"{path}: unreadable ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise StateError(f"{path}: damaged: not text (binary bytes)") from None
    except json.JSONDecodeError as err:
        raise StateError(
            f"{path}: damaged: not JSON ({err.msg} at line {err.lineno}, column {err.colno})"
        ) from None
    except RecursionError:
        raise StateError(f"{path}: damaged: nested too deeply to read") from None
    try:
        return RunState.from_dict(data, str(path))
    except ValueError as err:  # a value no check above knows (an enum's __post_init__ ...)
        raise StateError(f"{path}: damaged: {err}") from None


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
    def from_dict(cls, data: Any) -> NodeStatus:
        """TypeError or ValueError (a ValidationError) when the file's shape is not a status file's."""
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {_json_kind(data)} where a status (an object) belongs")
        return _status_adapter().validate_python(data)


@functools.cache
def _status_adapter() -> TypeAdapter[NodeStatus]:
    return TypeAdapter(NodeStatus)


def read_node_status(path: Path) -> NodeStatus | None:
    """The status file, or None when it is absent, being replaced (callers poll again) or damaged
    (its identity is then unknown: nothing is signalled on its word)."""
    return check_node_status(path)[0]


def check_node_status(path: Path) -> tuple[NodeStatus | None, str]:
    """(the status file, or None; why it cannot be used: "" when it reads, or is simply not there).
    The wrapper replaces the file atomically, so one that does not read is damaged, not torn."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return None, ""
    except OSError as err:
        return None, f"unreadable ({err.strerror or err})"
    except UnicodeDecodeError:
        return None, "not text (binary bytes)"
    except json.JSONDecodeError as err:
        return None, f"not JSON ({err.msg} at line {err.lineno}, column {err.colno})"
    except (ValueError, RecursionError) as err:  # an integer too long, nesting too deep
        return None, f"not JSON ({type(err).__name__})"
    try:
        return NodeStatus.from_dict(data), ""
    except TypeError as err:
        return None, str(err)
    except ValidationError as err:
        return None, validation_text(err)
