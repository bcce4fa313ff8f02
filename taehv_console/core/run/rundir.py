"""The run directory (docs/design.md's single source of truth for a run): where every file of a run
lives, how a run gets its readable unique id, and how a run is found again by id or path.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taehv_console.core.run.state import (
    NodeStatus,
    RunState,
    StateError,
    read_node_status,
    read_state,
    write_state,
)
from taehv_console.core.values import InputError
from trainer.config import ConfigError, TrainConfig, load_config
from trainer.families import DEFAULT_FAMILY, FAMILIES, exported_files

RUN_TOML = "run.toml"
STATE_JSON = "state.json"
LOCK = "lock"
STOP_REQUEST = "stop.request"
_SAFE = re.compile(r"[^a-z0-9-]+")


class RunNotFoundError(LookupError):
    """No run matches what was asked; the message says where it looked."""


def new_run_id(preset: str, now: float | None = None) -> str:
    """`20261122-023145-cpu-smoke`: sortable by start time and says what it runs."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    name = _SAFE.sub("-", preset.lower()).strip("-")[:40].strip("-") or "run"
    return f"{stamp}-{name}"


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def run_toml(self) -> Path:
        return self.path / RUN_TOML

    @property
    def state_path(self) -> Path:
        return self.path / STATE_JSON

    @property
    def lock_path(self) -> Path:
        return self.path / LOCK

    @property
    def stop_request_path(self) -> Path:
        return self.path / STOP_REQUEST

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def events(self) -> Path:
        return self.path / "events"

    @property
    def heartbeats(self) -> Path:
        return self.path / "heartbeat"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def final_weights(self) -> Path:
        """final/<family>.safetensors, named by the run's model.family (taehv.safetensors for runs
        from before families, and where run.toml cannot be read)."""
        try:
            family = load_config(self.run_toml).model.family
        except (ConfigError, OSError):
            family = DEFAULT_FAMILY
        return self.path / "final" / exported_files(family)[0]

    def node_log(self, node: int) -> Path:
        return self.logs / f"node-{node}.log"

    def node_status_path(self, node: int) -> Path:
        return self.logs / f"node-{node}.status.json"

    def node_status(self, node: int) -> NodeStatus | None:
        return read_node_status(self.node_status_path(node))

    def event_file(self, rank: int) -> Path:
        return self.events / f"rank-{rank}.jsonl"

    def has_state(self) -> bool:
        return self.state_path.is_file()

    def lost_state(self) -> str | None:
        """Why this run cannot be read when its state.json is missing although a console launched
        it (it was lost or deleted: a run that ran is not "rendered"), else None. Only a console
        leaves `lock` (never removed, emptied on release) and `supervisor.json`: `render`, and a run
        started without a console (sbatch by hand, taehv-train), leave neither."""
        if self.state_path.exists():
            return None
        traces = [n for n in (LOCK, "supervisor.json") if (self.path / n).exists()]
        if not traces:
            return None
        return (
            f"{self.state_path}: missing, but a console launched the run ({', '.join(traces)}): its "
            f"state was lost; the run's files are kept as they are (nothing is rewritten)"
        )

    def read_state(self) -> RunState:
        """The checked state (StateError names the file and field); a launched run whose
        state.json is gone is a StateError too, never a run to start afresh."""
        lost = self.lost_state()
        if lost:
            raise StateError(lost)
        return read_state(self.state_path)

    def write_state(self, state: RunState) -> RunState:
        return write_state(self.state_path, state)

    def load_config(self) -> TrainConfig:
        return load_config(self.run_toml)


class RunsDirError(InputError):
    """The runs path cannot hold runs: a file, or a folder this user cannot write."""


def runs_dir_problem(runs_dir: str | Path) -> str | None:
    """Why runs_dir cannot hold runs on this machine (it, or the nearest existing folder above it,
    is a file, or cannot be written), else None. Asked before anything is written under it."""
    root = Path(runs_dir).expanduser().absolute()
    at = root
    while not at.exists() and at != at.parent:
        at = at.parent
    if not at.is_dir():
        return f"runs path {root}: {at} is a file, not a directory; choose another --runs"
    if not os.access(at, os.W_OK | os.X_OK):
        return (
            f"runs directory {at} cannot be written (a read-only file system or its permissions); "
            "choose a writable --runs"
        )
    return None


def create_run_dir(runs_dir: str | Path, preset: str, now: float | None = None) -> RunDir:
    """A new, empty run directory under runs_dir. mkdir without exist_ok is the uniqueness check:
    two consoles starting the same preset in the same second get -2, -3 ... instead of sharing.
    RunsDirError when runs_dir cannot hold it."""
    root = Path(runs_dir).absolute()
    base = new_run_id(preset, now)
    try:
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            path = root / (base if n == 1 else f"{base}-{n}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            (path / "logs").mkdir()
            return RunDir(path)
    except OSError as err:  # a file in the way, a read-only file system, permissions
        raise RunsDirError(
            runs_dir_problem(root) or f"{root}: cannot create a run directory: {err.strerror or err}"
        ) from None
    raise RuntimeError(f"{root}: could not find a free run id for {base}")


def list_runs(runs_dir: str | Path) -> list[RunDir]:
    """Run directories (those holding run.toml) under runs_dir, newest first by id."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    runs = [RunDir(p.absolute()) for p in root.iterdir() if p.is_dir() and (p / RUN_TOML).is_file()]
    # ids start with the start time, so the name orders them; mtime breaks ties between copies
    return sorted(runs, key=lambda r: (r.run_id, _mtime(r.path)), reverse=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def resolve_run(ref: str | None, runs_dir: str | Path = "runs") -> RunDir:
    """A run from what the user typed: a path to a run directory (or its run.toml), a run id under
    runs_dir, or a unique prefix of one. None: the newest run under runs_dir."""
    if ref:
        p = Path(ref).expanduser()
        if p.name == RUN_TOML and p.is_file():
            p = p.parent
        if (p / RUN_TOML).is_file():
            return RunDir(p.absolute())
        if os.sep not in ref:
            candidate = Path(runs_dir) / ref
            if (candidate / RUN_TOML).is_file():
                return RunDir(candidate.absolute())
            matches = [r for r in list_runs(runs_dir) if r.run_id.startswith(ref)]
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                names = ", ".join(r.run_id for r in matches[:5])
                raise RunNotFoundError(
                    f"{ref!r} matches {len(matches)} runs in {runs_dir} ({names}); give more of the id"
                )
        raise RunNotFoundError(
            f"no run {ref!r}: not a run directory (one holding {RUN_TOML}) and not a run id "
            f"in {Path(runs_dir).absolute()} (use --runs DIR)"
        )
    runs = list_runs(runs_dir)
    if not runs:
        raise RunNotFoundError(f"no runs in {Path(runs_dir).absolute()} (use --runs DIR, or name the run)")
    return runs[0]


def family_fields(family: str) -> dict[str, Any]:
    """What `status`, its --json and the TUI's dashboard say of a run's TAE family: its name, the
    video model it serves, and the files final/ and best/ hold its weights under (the .safetensors
    and the author's .pth beside it, then the EMA's)."""
    fam = FAMILIES.get(family)
    weights, ema = exported_files(family)
    return {
        "family": family,
        "serves": fam.serves if fam is not None else "shapes of no family (taehv's conventions)",
        "exports": [
            weights,
            weights.replace(".safetensors", ".pth"),
            ema,
            ema.replace(".safetensors", ".pth"),
        ],
    }


def family_text(fields: dict[str, Any]) -> str:
    """'taew2_1 (Wan 2.1, ...), exported as taew2_1.safetensors + .pth': one line of it."""
    exports = fields.get("exports") or []
    named = f", exported as {exports[0]} + .pth" if exports else ""
    return f"{fields.get('family')} ({fields.get('serves')}){named}"
