"""The values forensics hands to the one run view: which rank stalled, the stacks taken, and what
Flight Recorder and NCCL RAS said. Frozen and JSON-ready so every front end renders the same thing."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RankRef:
    """A rank as its heartbeat names it (heartbeat/rank-<r>.json: step, time, pid, host)."""

    rank: int
    node: int
    host: str
    pid: int


@dataclass(frozen=True)
class StackDump:
    """One stack dump of one rank: py-spy's, or the rank's own (faulthandler) where py-spy cannot.
    `frames` are the main thread's, innermost first (py-spy's own order): frames[0] is where the
    rank is right now. The whole dump, every thread, is in `path`."""

    rank: int
    role: str  # "stalled" | "peer"
    frames: tuple[str, ...]
    path: str
    host: str = ""
    pid: int = 0
    time: float = 0.0
    process_state: str = ""  # /proc state letter when known: "T" = stopped (SIGSTOP)
    threads: int = 0

    @classmethod
    def from_json(cls, d: dict) -> StackDump:
        return cls(
            rank=int(d["rank"]),
            role=str(d["role"]),
            frames=tuple(d.get("frames", ())),
            path=str(d.get("path", "")),
            host=str(d.get("host", "")),
            pid=int(d.get("pid", 0)),
            time=float(d.get("time", 0.0)),
            process_state=str(d.get("process_state", "")),
            threads=int(d.get("threads", 0)),
        )

    def to_json(self) -> dict:
        return {
            "rank": self.rank,
            "role": self.role,
            "frames": list(self.frames),
            "path": self.path,
            "host": self.host,
            "pid": self.pid,
            "time": self.time,
            "process_state": self.process_state,
            "threads": self.threads,
        }


@dataclass(frozen=True)
class ForensicsReport:
    stalled_rank: int
    dumps: tuple[StackDump, ...]
    notes: tuple[str, ...]  # what could not be done and why, each said once
    flight_recorder: tuple[str, ...]  # the analyser's verdict lines
    ras: str | None  # NCCL RAS verdict when available
    time: float = 0.0
    fr_dir: str = ""  # where the Flight Recorder dumps were copied, when any were
    ras_text: str = field(default="", repr=False, compare=False)  # the raw RAS answer behind `ras`

    @property
    def stalled_dump(self) -> StackDump | None:
        return next((d for d in self.dumps if d.role == "stalled"), None)

    def to_json(self) -> dict:
        return {
            "stalled_rank": self.stalled_rank,
            "time": self.time,
            "dumps": [d.to_json() for d in self.dumps],
            "notes": list(self.notes),
            "flight_recorder": list(self.flight_recorder),
            "fr_dir": self.fr_dir,
            "ras": self.ras,
        }

    @classmethod
    def from_json(cls, d: dict) -> ForensicsReport:
        """The inverse of to_json (what another process, e.g. `status`, reads back from the run)."""
        return cls(
            stalled_rank=int(d["stalled_rank"]),
            dumps=tuple(StackDump.from_json(x) for x in d.get("dumps", ())),
            notes=tuple(d.get("notes", ())),
            flight_recorder=tuple(d.get("flight_recorder", ())),
            ras=d.get("ras"),
            time=float(d.get("time", 0.0)),
            fr_dir=str(d.get("fr_dir", "")),
        )
