"""What the watch layer hands out: immutable snapshots of a run and its nodes (ClusterState and
the values inside it). Plain data only: the TUI, the headless front end and `status --json` render
the same object, and nothing here ever queries a device or a file on attribute access.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import itertools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from taehv_console.core.logscan import LogSignal  # the view carries the signals it was given
from taehv_console.core.watch.nodesample import NodeSample

if TYPE_CHECKING:
    from taehv_console.core.run.state import Failure, RunState

_T = TypeVar("_T")


class RankState(str, enum.Enum):
    STARTING = "starting"  # launched, no step finished yet
    HEALTHY = "healthy"
    STRAGGLER = "straggler"  # progressing, but its own work per step is slow against the fastest rank
    STALLED = "stalled"  # no heartbeat progress past the threshold (and it is the one holding others up)
    FAILED = "failed"  # process gone, error event, or an error line naming it
    STOPPED = "stopped"  # finished or stopped on request (a stop event), not a fault


class NodeState(str, enum.Enum):
    OK = "ok"
    DEGRADED = "degraded"  # a straggler rank or a GPU problem (lost device, thermal/power slowdown)
    STALLED = "stalled"
    FAILED = "failed"
    LOST = "lost"  # its agent has been silent past the agent timeout
    UNKNOWN = "unknown"  # nothing heard yet


class CheckpointState(str, enum.Enum):
    COMPLETE = "complete"
    IN_PROGRESS = "in_progress"
    INCOMPLETE = "incomplete"


def copy_replacing(obj: _T, **changes: Any) -> _T:
    """dataclasses.replace(obj, **changes) for a frozen dataclass without __post_init__ or
    __slots__ (RankHealth, RankObservation), without running __init__ again: a third of the cost,
    for values the monitor makes anew for each of 2,048 ranks on every tick."""
    new = object.__new__(type(obj))
    fields = new.__dict__
    fields.update(obj.__dict__)
    fields.update(changes)
    return new


# ----------------------------------------------------------------------------------------- health


@dataclass(frozen=True)
class RankHealth:
    """One training process. `score` follows the resilience tooling: the fastest rank's own work
    per step divided by this rank's (1.0 = as fast as the fastest, 0.5 = twice as slow)."""

    rank: int
    node: str
    state: RankState
    step: int | None = None
    heartbeat_age_s: float | None = None
    step_time_s: float | None = None  # median of recent steps (the same on every rank: collectives)
    busy_s: float | None = None  # median of recent (step time - time waiting for other ranks)
    score: float | None = None
    pid: int | None = None
    process: str = ""  # the agent's view of the process ("" when no agent reports it)
    blocked_by: int | None = None  # healthy, but stuck in a collective waiting for this rank
    detail: str = ""
    waiting_s: float | None = None  # blocked in a collective this long (the trainer's heartbeat says so)
    # every other number the rank's heartbeat carries (wait_s, data_wait_s ...), by name
    metrics: tuple[tuple[str, float], ...] = ()

    def metric(self, name: str) -> float | None:
        for k, v in self.metrics:
            if k == name:
                return v
        return None

    @property
    def data_wait_share(self) -> float | None:
        """Share of the rank's latest step spent waiting for its next batch (None: a trainer that
        does not report it). High means its loader workers do not keep up."""
        wait, step = self.metric("data_wait_s"), self.metric("step_time_s")
        return min(1.0, max(0.0, wait / step)) if wait is not None and step else None


@dataclass(frozen=True)
class CollectiveStall:
    """Every live rank stopped making progress together: a collective is waiting for someone.
    Reported from heartbeats (and the watchdog's counts when present) before the timeout fires."""

    laggard_rank: int | None
    laggard_node: str | None
    step: int | None  # the last step every rank finished
    stalled_for_s: float
    timeout_s: float | None = None  # the run's collective timeout, when run.toml states it
    waiting_ranks: tuple[int, ...] = ()
    evidence: str = ""

    @property
    def timeout_in_s(self) -> float | None:
        return None if self.timeout_s is None else max(0.0, self.timeout_s - self.stalled_for_s)


@dataclass(frozen=True)
class ForensicsSummary:
    """What the forensics of one confirmed stall found (core/forensics writes the report into the
    run directory's forensics/; every front end reads it from there): the stalled rank's stack,
    top frame first, and what the tools said (py-spy missing, Flight Recorder unavailable ...)."""

    rank: int | None
    node: str | None = None
    host: str | None = None
    pid: int | None = None
    time: float | None = None
    frames: tuple[str, ...] = ()  # the stalled rank's main-thread stack, innermost first
    peer_frames: tuple[str, ...] = ()  # a healthy peer's, for comparison
    dump_path: str | None = None
    notes: tuple[str, ...] = ()
    flight_recorder: str = ""
    ras: str = ""
    report: str = ""  # the report file, relative to the run directory

    @classmethod
    def from_report(cls, data: object, path: str = "") -> ForensicsSummary:
        """From a ForensicsReport's to_json() dict; unknown keys are ignored, missing ones empty."""
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a forensics report is a JSON object")  # noqa: TRY004 - callers catch ValueError for bad files
        stalled = data.get("stalled_rank")
        stalled_ref = data.get("stalled")
        ref: dict[str, Any] = stalled_ref if isinstance(stalled_ref, dict) else {"rank": stalled}
        if not isinstance(ref.get("rank"), int) and isinstance(stalled, int):
            ref = {**ref, "rank": stalled}
        dumps = [d for d in data.get("dumps") or () if isinstance(d, dict)]

        def frames_of(d: dict | None) -> tuple[str, ...]:
            if d is None:
                return ()
            return tuple(_frame_text(f) for f in d.get("frames") or ())

        mine = next((d for d in dumps if d.get("role") == "stalled"), None) or next(
            (d for d in dumps if d.get("rank") == ref.get("rank")), None
        )
        peer = next((d for d in dumps if d is not mine), None)
        if mine is not None:
            ref = {
                "host": mine.get("host") or None,
                "pid": mine.get("pid") or None,
                **{k: v for k, v in ref.items() if v is not None},
            }

        def text(v: object) -> str:
            if v is None:
                return ""
            if isinstance(v, str):
                return v
            if isinstance(v, (list, tuple)):
                return "; ".join(str(x) for x in v)
            if isinstance(v, dict):
                return str(v.get("summary") or v.get("verdict") or v.get("note") or json_text(v))
            return str(v)

        t = data.get("time")
        return cls(
            rank=ref.get("rank") if isinstance(ref.get("rank"), int) else None,
            node=_opt_str(ref.get("node")),
            host=_opt_str(ref.get("host")),
            pid=ref.get("pid") if isinstance(ref.get("pid"), int) else None,
            time=float(t) if isinstance(t, (int, float)) else None,
            frames=frames_of(mine),
            peer_frames=frames_of(peer),
            dump_path=_opt_str(mine.get("path")) if mine else None,
            notes=tuple(str(n) for n in data.get("notes") or ()),
            flight_recorder=text(data.get("flight_recorder")),
            ras=text(data.get("ras")),
            report=path,
        )


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


def _frame_text(f: object) -> str:
    if isinstance(f, str):
        return f
    if isinstance(f, dict):
        name = f.get("name") or f.get("function") or "?"
        where = f.get("filename") or f.get("file") or ""
        line = f.get("line") or f.get("lineno")
        return f"{name} ({where}:{line})" if where else str(name)
    return str(f)


def json_text(v: object) -> str:
    return json.dumps(v, default=str)[:300]


# ------------------------------------------------------------------------------------------ nodes


@dataclass(frozen=True)
class NodeSnapshot:
    name: str  # as the console reaches it (hostfile name, or the heartbeat's host)
    state: NodeState
    detail: str = ""
    sample: NodeSample | None = None
    sample_age_s: float | None = None
    ranks: tuple[int, ...] = ()
    clock_offset_s: float | None = None  # node clock minus console clock, from agent samples
    agent: str = ""  # "off", "starting", "running", "restarting: <why>"
    facts: Any = None  # NodeFacts from the probe, when the caller has them


# ------------------------------------------------------------------------------------ checkpoints


@dataclass(frozen=True)
class CheckpointInfo:
    name: str
    step: int
    state: CheckpointState
    bytes: int = 0
    age_s: float | None = None
    problems: tuple[str, ...] = ()
    world_size: int | None = None
    zero_stage: int | None = None
    is_latest: bool = False  # what checkpoints/latest names


@dataclass(frozen=True)
class CheckpointSummary:
    items: tuple[CheckpointInfo, ...] = ()  # newest step first
    latest: str | None = None
    newest_complete_step: int | None = None
    every: int | None = None
    next_due_step: int | None = None
    problems: tuple[str, ...] = ()

    @property
    def complete(self) -> tuple[CheckpointInfo, ...]:
        return tuple(c for c in self.items if c.state is CheckpointState.COMPLETE)


# ------------------------------------------------------------------------------- logs and notices


@dataclass(frozen=True)
class Notice:
    """One of the last N notable things (events, health changes, log signals), newest last."""

    time: float
    severity: str  # info | warning | error
    source: str  # events | health | log | checkpoint | agent
    text: str
    rank: int | None = None
    node: str | None = None


# -------------------------------------------------------------------------------- run and history


@dataclass(frozen=True)
class RunHeader:
    run_dir: str
    run_id: str
    # waiting | starting | running | stalled | done | stopped | failed
    phase: str = "waiting"
    console_phase: str | None = None  # what the console's state.json says, when there is one
    step: int | None = None
    max_steps: int | None = None
    world_size: int | None = None
    preset: str | None = None
    loss: float | None = None
    psnr: float | None = None
    lr: float | None = None
    clips_per_s: float | None = None
    mfu: float | None = None  # model FLOPs utilisation per GPU, 0-1 (the step event's; GPUs only)
    step_time_s: float | None = None
    eta_s: float | None = None
    val_step: int | None = None
    val_psnr: float | None = None
    best_val_psnr: float | None = None
    started: float | None = None
    updated: float | None = None  # time of the newest event or heartbeat
    stop_reason: str | None = None
    data_skipped: int = 0
    nonfinite_skipped: int = 0


class Series:
    """A bounded history for a sparkline: (x, y) points, x = step for metrics, time for telemetry.

    Immutable, like the dataclasses around it. `Series.of_blocks` makes one out of a PointHistory's
    frozen blocks without copying the points: a 2,048-GPU view holds 2,048 utilisation series, all
    of them new after each round of agent samples, and flattening every one on every view was a
    fifth of the view's cost while only a node's drill-down ever reads them. `points` flattens on
    first use and keeps the result."""

    __slots__ = ("_blocks", "_limit", "_points", "name")
    name: str
    _points: tuple[tuple[float, float], ...] | None  # None until the blocks are flattened
    _blocks: tuple[tuple[tuple[float, float], ...], ...] | None  # None once flattened
    _limit: int

    def __init__(self, name: str, points: Iterable[tuple[float, float]] = ()):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_points", tuple(points))
        object.__setattr__(self, "_blocks", None)
        object.__setattr__(self, "_limit", 0)

    @classmethod
    def of_blocks(cls, name: str, blocks: tuple[tuple[tuple[float, float], ...], ...], limit: int) -> Series:
        """The last `limit` points of `blocks` (oldest first), flattened only when read."""
        s = cls.__new__(cls)
        _SERIES_NAME(s, name)  # the slots' own setters: cheaper than object.__setattr__ per field
        _SERIES_POINTS(s, None)
        _SERIES_BLOCKS(s, blocks)
        _SERIES_LIMIT(s, limit)
        return s

    @property
    def points(self) -> tuple[tuple[float, float], ...]:
        points = self._points
        if points is None:
            flat = tuple(itertools.chain.from_iterable(self._blocks or ()))
            points = flat[-self._limit :] if len(flat) > self._limit else flat
            object.__setattr__(self, "_points", points)
            object.__setattr__(self, "_blocks", None)
        return points

    @property
    def values(self) -> tuple[float, ...]:
        return tuple(p[1] for p in self.points)

    @property
    def last(self) -> float | None:
        if self._points is None:  # the newest point, without flattening
            return next((b[-1][1] for b in reversed(self._blocks or ()) if b), None)
        return self._points[-1][1] if self._points else None

    def __setattr__(self, key: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {key!r}")

    def __delattr__(self, key: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {key!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Series):
            return NotImplemented
        return self is other or (self.name == other.name and self.points == other.points)

    def __hash__(self) -> int:
        return hash((self.name, self.points))

    def __repr__(self) -> str:
        return f"Series(name={self.name!r}, points={self.points!r})"

    def __reduce__(self) -> tuple:
        # copy, deepcopy (dataclasses.asdict of a view) and pickle rebuild it through __init__: the
        # default way sets the slots one by one, which __setattr__ refuses
        return (Series, (self.name, self.points))


_SERIES_NAME, _SERIES_POINTS, _SERIES_BLOCKS, _SERIES_LIMIT = (
    Series.__dict__[k].__set__ for k in ("name", "_points", "_blocks", "_limit")
)


class PointHistory:
    """The newest `maxlen` points of one series, kept as frozen blocks plus a short open tail, so
    a snapshot (`series`) shares the blocks instead of copying every point each time."""

    BLOCK = 16

    def __init__(self, maxlen: int):
        self.maxlen = maxlen
        self._blocks: collections.deque[tuple[tuple[float, float], ...]] = collections.deque()
        self._tail: list[tuple[float, float]] = []

    def append(self, point: tuple[float, float]) -> None:
        self._tail.append(point)
        if len(self._tail) >= self.BLOCK:
            self._blocks.append(tuple(self._tail))
            self._tail = []
            while (len(self._blocks) - 1) * self.BLOCK >= self.maxlen:  # the rest still hold maxlen points
                self._blocks.popleft()

    def series(self, name: str) -> Series:
        return Series.of_blocks(name, (*self._blocks, tuple(self._tail)), self.maxlen)

    def __len__(self) -> int:
        return min(self.maxlen, len(self._blocks) * self.BLOCK + len(self._tail))


@dataclass(frozen=True)
class Histories:
    loss: Series = field(default_factory=lambda: Series("loss"))
    psnr: Series = field(default_factory=lambda: Series("psnr"))
    lr: Series = field(default_factory=lambda: Series("lr"))
    val_psnr: Series = field(default_factory=lambda: Series("val_psnr"))
    clips_per_s: Series = field(default_factory=lambda: Series("clips_per_s"))
    gpu_util: tuple[Series, ...] = ()  # one per GPU, named "<node>/<index>"


@dataclass(frozen=True)
class SourceStatus:
    """How one poller is doing: the UI shows a stale source instead of stale numbers."""

    name: str
    ok: bool = True
    last_ok: float | None = None
    error: str = ""
    polls: int = 0
    last_duration_s: float | None = None
    running_for_s: float | None = None  # set while a poll runs past its timeout


@dataclass(frozen=True)
class RunView:
    """The one view of a run every front end renders (TUI, --no-tui plain and --json, status,
    attach): phase, progress and ETA in `run`, per-rank and per-node health, the collective stall,
    checkpoints, the console's record (state.json: failure diagnosis, stop) and stall forensics."""

    time: float
    seq: int
    run: RunHeader
    nodes: tuple[NodeSnapshot, ...] = ()
    ranks: tuple[RankHealth, ...] = ()
    collective: CollectiveStall | None = None
    checkpoints: CheckpointSummary = field(default_factory=CheckpointSummary)
    history: Histories = field(default_factory=Histories)
    notices: tuple[Notice, ...] = ()
    signals: tuple[LogSignal, ...] = ()
    scalars: tuple[Series, ...] = ()  # TensorBoard scalars when a logdir is watched
    sources: tuple[SourceStatus, ...] = ()
    console: RunState | None = (
        None  # the RunState from state.json (phase, attempts, failure, stop), when there is one
    )
    forensics: tuple[ForensicsSummary, ...] = ()  # newest last
    # records skipped as damaged (an event line, a heartbeat, a forensics report), each named by
    # file (and line) and why: the rest of the run was read around them
    damaged: tuple[str, ...] = ()

    @property
    def failure(self) -> Failure | None:
        """The failure diagnosis the controlling console recorded (core/run/failure.py)."""
        return self.console.failure if self.console is not None else None

    @property
    def stalled(self) -> tuple[RankHealth, ...]:
        """The ranks named as stalled (the laggard of a collective stall, or a rank left behind)."""
        return tuple(r for r in self.ranks if r.state is RankState.STALLED)

    def forensics_for(self, rank: int) -> ForensicsSummary | None:
        for f in reversed(self.forensics):
            if f.rank == rank:
                return f
        return None

    def node(self, name: str) -> NodeSnapshot | None:
        for n in self.nodes:
            if n.name == name:
                return n
        return None

    def rank(self, rank: int) -> RankHealth | None:
        for r in self.ranks:
            if r.rank == rank:
                return r
        return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (`status --json`): enums as their values, tuples as lists, NaN as None."""
        return _plain(self)


ClusterState = RunView  # the name the TUI's messages and older callers use


def _plain(obj: Any) -> Any:
    if isinstance(obj, enum.Enum):
        return obj.value
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if hasattr(obj, "to_dict") and not isinstance(obj, RunView):
            return obj.to_dict()  # NodeFacts and friends know their own form
        out = {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        if isinstance(obj, LogSignal):
            out["fields"] = {k: _plain(v) for k, v in obj.fields}
        if isinstance(obj, CollectiveStall):
            out["timeout_in_s"] = obj.timeout_in_s
        if isinstance(obj, RankHealth):
            out["metrics"] = {k: _plain(v) for k, v in obj.metrics}
            out["data_wait_share"] = obj.data_wait_share
        if isinstance(obj, RunView):
            out["stalled"] = [r.rank for r in obj.stalled]
        return out
    if isinstance(obj, Series):
        return {"name": obj.name, "points": _plain(obj.points)}
    if isinstance(obj, (tuple, list)):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
