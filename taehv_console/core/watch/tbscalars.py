"""Scalars from a TensorBoard logdir, read incrementally with TensorBoard's own event-file loader,
so a run started by other tools can be watched too (`taehv-console attach --tensorboard DIR`).

Each event file keeps one loader, which holds its offset and stops cleanly at a record still being
written (it resumes there on the next poll). Subdirectories holding event files are runs, as in
TensorBoard itself. TensorFlow is not needed: tensorboard falls back to its own record reader.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taehv_console.core.watch.state import Series

# TAEHV's tags, and the history each one feeds when no trainer events are there to feed it.
HISTORY_TAGS = {
    "train/loss": "loss",
    "train/psnr": "psnr",
    "train/lr": "lr",
    "val/psnr": "val_psnr",
    "train/samples_per_s": "clips_per_s",
}


@dataclass(frozen=True)
class ScalarPoint:
    run: str  # "" for event files directly in the logdir
    tag: str
    step: int
    wall_time: float
    value: float


class TensorBoardScalars:
    def __init__(self, logdir: str | Path, max_points: int = 600):
        self.logdir = Path(logdir)
        self.max_points = max_points
        self._loaders: dict[str, Any] = {}
        self._series: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self.files = 0

    def poll(self) -> list[ScalarPoint]:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util

        out: list[ScalarPoint] = []
        for path in self._event_files():
            loader = self._loaders.get(path)
            if loader is None:
                loader = self._loaders[path] = EventFileLoader(path)
            run = os.path.relpath(os.path.dirname(path), self.logdir)
            run = "" if run == "." else run
            for event in loader.Load():
                if not event.HasField("summary"):
                    continue
                for value in event.summary.value:
                    if not value.HasField("tensor"):
                        continue
                    try:
                        arr = tensor_util.make_ndarray(value.tensor)
                    except Exception:  # noqa: BLE001, S112 - a dtype this reader does not know: not ours
                        continue
                    if arr.size != 1 or arr.dtype.kind not in "fiu":
                        continue  # images, histograms, text
                    p = ScalarPoint(
                        run, value.tag, int(event.step), float(event.wall_time), float(arr.reshape(()))
                    )
                    out.append(p)
                    series = self._series.get((run, value.tag))
                    if series is None:
                        series = self._series[(run, value.tag)] = deque(maxlen=self.max_points)
                    series.append((float(p.step), p.value))
        self.files = len(self._loaders)
        return out

    def series(self) -> tuple[Series, ...]:
        return tuple(
            Series(f"{run}/{tag}" if run else tag, tuple(points))
            for (run, tag), points in sorted(self._series.items())
        )

    def _event_files(self) -> list[str]:
        found = []
        for dirpath, _dirs, files in os.walk(self.logdir):
            for f in files:
                if "tfevents" in f and not f.endswith(".profile-empty"):
                    found.append(os.path.join(dirpath, f))
        return sorted(found)
