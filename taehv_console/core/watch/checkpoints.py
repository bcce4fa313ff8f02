"""Checkpoint status for a snapshot: complete / in progress / incomplete per docs/design.md's protocol,
with step, size, age, what `latest` names and the next step a save is due.

Verification is the trainer's own (`trainer.checkpoint.verify`: manifest, file sizes, zip central
directories; nothing is unpickled). A directory is verified deeply once; later polls re-check the
sizes against its manifest only, so a shard truncated afterwards is still caught without reading
every archive directory every few seconds.

A `step-N.tmp` directory is "in progress" only while a writer can exist: the run is live, its save
started (checkpoint event) and has neither completed nor failed, and no newer checkpoint finished.
Otherwise it is an abandoned half-written directory and reported incomplete.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from taehv_console.core.watch.state import CheckpointInfo, CheckpointState, CheckpointSummary
from trainer import checkpoint as ckpt


@dataclass(frozen=True)
class RunActivity:
    """What the rest of the snapshot knows about the writer side."""

    live: bool  # some rank is running (not stopped, not failed)
    step: int | None = None  # newest step finished
    max_steps: int | None = None
    every: int | None = None  # schedule.checkpoint_every
    events: Mapping[int, dict] | None = None  # step -> newest checkpoint event (None: no events seen)
    tmp_grace_s: float = 900.0  # without events: a .tmp younger than this may still be written


class CheckpointWatcher:
    """Keeps per-directory verification results between polls."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._deep_done: dict[str, tuple[int, int]] = {}  # dir name -> identity verified deeply

    def summary(self, activity: RunActivity, now: float | None = None) -> CheckpointSummary:
        now = time.time() if now is None else now
        entries = []
        try:
            it = list(os.scandir(self.root))
        except OSError:
            it = []
        for e in it:
            m = ckpt.STEP_RE.match(e.name) or ckpt.TMP_RE.match(e.name)
            if m and e.is_dir():
                entries.append((int(m.group(1)), e))
        latest, latest_problem = ckpt.read_latest(self.root)
        items: list[CheckpointInfo] = []
        live_names = set()
        newest_complete: int | None = None
        for step, e in sorted(entries, key=lambda x: (x[0], x[1].name), reverse=True):
            live_names.add(e.name)
            ident = _identity(e)
            deep = self._deep_done.get(e.name) != ident
            st = ckpt.verify(Path(e.path), deep=deep)
            if st.ok:
                self._deep_done[e.name] = ident
            state = CheckpointState(st.state)
            ckpt_problems = st.problems
            if state is CheckpointState.IN_PROGRESS:
                why = _abandoned(step, e, activity, newest_complete, now)
                if why:
                    state, ckpt_problems = CheckpointState.INCOMPLETE, (why, *ckpt_problems[1:])
            if state is CheckpointState.COMPLETE and newest_complete is None:
                newest_complete = step
            nbytes = st.bytes or (_tree_bytes(Path(e.path)) if state is not CheckpointState.COMPLETE else 0)
            items.append(
                CheckpointInfo(
                    name=e.name,
                    step=step,
                    state=state,
                    bytes=nbytes,
                    age_s=round(max(0.0, now - st.mtime), 1) if st.mtime else None,
                    problems=tuple(ckpt_problems),
                    world_size=st.world_size,
                    zero_stage=st.zero_stage,
                    is_latest=(e.name == latest),
                )
            )
        for name in list(self._deep_done):
            if name not in live_names:
                del self._deep_done[name]
        problems: list[str] = [latest_problem] if latest_problem else []
        if latest is not None:
            named = next((c for c in items if c.name == latest), None)
            if named is None:
                problems.append(f"latest names {latest}, which does not exist")
            elif named.state is not CheckpointState.COMPLETE:
                problems.append(
                    f"latest names {latest}, which is {named.state.value}: {'; '.join(named.problems)}"
                )
        return CheckpointSummary(
            items=tuple(items),
            latest=latest,
            newest_complete_step=newest_complete,
            every=activity.every,
            next_due_step=_next_due(activity),
            problems=tuple(problems),
        )


def _abandoned(step: int, entry: os.DirEntry, a: RunActivity, newest_complete: int | None, now: float) -> str:
    """Why a .tmp directory cannot be in progress ("" when it may well be)."""
    if not a.live:
        return "abandoned: half-written and no rank of the run is running"
    if newest_complete is not None and newest_complete > step:
        return f"abandoned: step {newest_complete} completed after it"
    try:
        age = now - entry.stat().st_mtime
    except OSError:
        return ""
    ev = a.events.get(step) if a.events else None
    if ev is not None:
        if ev.get("status") == "failed":
            return f"save failed: {ev.get('message') or 'see the events'}"
        if ev.get("status") == "complete":
            return "abandoned: the save of this step completed"
        return ""  # started and not finished: being written
    # The run reports its saves and never started this one (a young directory may simply be ahead
    # of the events poll).
    if a.events and age > 60:
        return "abandoned: left from an earlier attempt (no save of this step started)"
    return f"abandoned: untouched for {age:.0f} s" if age > a.tmp_grace_s else ""


def _identity(entry: os.DirEntry) -> tuple[int, int]:
    # Inode numbers are reused after a delete: a re-save of the same step can get the old one, so
    # the COMPLETE marker's mtime is part of what "the same directory" means.
    try:
        marker = os.stat(os.path.join(entry.path, ckpt.COMPLETE)).st_mtime_ns
    except OSError:
        marker = 0
    return entry.inode(), marker


def _next_due(a: RunActivity) -> int | None:
    if not a.every:
        return None
    nxt = ((a.step or 0) // a.every + 1) * a.every
    if a.max_steps is not None and nxt > a.max_steps:
        return a.max_steps  # the final save at the last step
    return nxt


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def verify_checkpoints(run_dir: str | Path) -> list[ckpt.CheckpointStatus]:
    """Every checkpoint of a run verified in full, file hashes included (reads every byte, so
    on request only: `status --verify`), newest first."""
    s = ckpt.scan(Path(run_dir) / "checkpoints")
    found = [ckpt.verify(st.path, hashes=True) for st in s.complete] + s.skipped
    return sorted(found, key=lambda st: (st.step, st.path.name), reverse=True)
