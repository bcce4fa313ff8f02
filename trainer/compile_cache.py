"""The run's compile cache: torch.compile's portable artifacts kept in the run directory, so that a
rank on a machine that never compiled this model compiles from cache instead of from cold.

Inductor keeps its own cache under /tmp (TORCHINDUCTOR_CACHE_DIR), which a relaunch on the same
machine finds. A restarted pod, a spare node that takes a lost node's place, or the next SLURM
allocation starts with an empty /tmp and compiles every stage again: the first step of a compiled
run took 42-61 s from cold on an H100 node, against 12 s warm (docs/performance.md), and every
recovery on a fresh machine paid it again. Rank 0 saves torch's cache artifacts
(`torch.compiler.save_cache_artifacts`: Inductor's compiled graphs, with their Triton kernels on a
GPU, and AOTAutograd's traced forward and backward graphs) after the first step and after each
validation that used a graph the run's cache lacks, whether compiled or found in this machine's
Inductor cache; every rank loads them before its first compile. A file that does not load is
reported and passed over: the cache can only save time, never fail a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.events import atomic_write_text

CACHE_DIR = "compile-cache"


def cache_dir(run_dir: Path, device: torch.device) -> Path:
    """RUN/compile-cache/torch-<version>-<device>/: one folder per torch release and device kind, so
    a run resumed under another torch or on another GPU generation never reads a foreign file."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        tag = f"cuda-sm{major}{minor}"
    else:
        tag = device.type
    return run_dir / CACHE_DIR / f"torch-{torch.__version__}-{tag}"


def _inductor_counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {
        "hits": int(counters["inductor"]["fxgraph_cache_hit"]),
        "misses": int(counters["inductor"]["fxgraph_cache_miss"]),
        # AOTAutograd's own cache, above Inductor's: a hit skips tracing the graph's forward and
        # backward; a bypass is a graph it would not keep (traced again in every process)
        "aot_hits": int(counters["aot_autograd"]["autograd_cache_hit"]),
        "aot_bypasses": int(counters["aot_autograd"]["autograd_cache_bypass"]),
    }


def _keys(info: Any) -> set[tuple[str, str]]:
    """The (kind, key) of each artifact a torch CacheInfo names."""
    return {(kind, key) for kind, keys in info.artifacts.items() for key in keys}


def _parts(folder: Path) -> list[tuple[int, Path]]:
    parts = []
    for p in folder.glob("part-*.bin"):
        try:
            parts.append((int(p.stem.split("-", 1)[1]), p))
        except ValueError:
            continue
    return sorted(parts)


@dataclass
class CompileCache:
    """This rank's use of the run's compile cache: `load` once before the first compile, `save_new`
    (rank 0's call writes) after each phase that may have compiled, `summary` for the event.

    The cache is a folder of parts, each one call of `save_cache_artifacts`, loaded in order. One file
    rewritten would be simpler, but torch 2.13 cannot read back a second save of one process whole:
    each save appends to the same serialised list, and loading keeps only the last entry per kind of
    artifact (the first step's graphs were lost once validation's were saved).
    """

    folder: Path
    writer: bool  # rank 0 writes; every rank reads
    loaded: int = 0  # distinct artifacts loaded from the parts
    error: str | None = None  # why a part did not load, or could not be written
    saved: int = 0  # artifacts in the last part this rank wrote
    # the artifacts the run's cache holds, as far as this process knows: loaded or written by it
    _known: set[tuple[str, str]] = field(default_factory=set, repr=False)
    # graphs compiled or found in Inductor's cache when save_new last looked
    _looked_at: int = field(default=0, repr=False)

    def load(self) -> None:
        seen: set[tuple[str, str]] = set()
        problems = []
        for _, path in _parts(self.folder):
            try:
                data = path.read_bytes()
            except OSError as e:
                problems.append(f"{path}: {e.strerror or e}")
                continue
            try:
                info = torch.compiler.load_cache_artifacts(data) if data else None
            except Exception as e:  # noqa: BLE001 - a cache never fails a run (writing Inductor's files)
                problems.append(f"{path}: not loaded: {type(e).__name__}: {e}")
                continue
            if info is None:
                # torch logs its reason and returns None for a file it cannot read (truncated, foreign)
                problems.append(f"{path}: not a torch {torch.__version__} compile cache (ignored)")
                continue
            seen |= _keys(info)
        self.loaded = len(seen)
        self._known = seen
        self.error = "; ".join(problems) or None

    def save_new(self) -> bool:
        """Write a new part when this process used a graph the run's cache lacks (rank 0 only): one
        it compiled, or one it found in Inductor's own cache under /tmp. A new run on a node that ran
        this model before finds every graph there and compiles none, and its run's cache must still
        hold them, or its first recovery on a fresh machine compiles from cold. Torch records a graph
        found as it records one compiled, so what it would save, less what was loaded from the run's
        cache or written before, is what is missing. Written atomically: a reader sees a whole part
        or none."""
        counts = _inductor_counters()
        used = counts["hits"] + counts["misses"]
        if not self.writer or used <= self._looked_at:
            return False  # no graph compiled or found since the last look
        self._looked_at = used
        try:
            saved = torch.compiler.save_cache_artifacts()
        except Exception as e:  # noqa: BLE001 - a cache never fails a run
            self.error = f"{self.folder}: not saved: {type(e).__name__}: {e}"
            return False
        if saved is None:
            return False
        data, info = saved
        keys = _keys(info)
        if keys <= self._known:
            return False  # a resume that found every graph in what it loaded: nothing to add
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            n = max((i for i, _ in _parts(self.folder)), default=0) + 1
            atomic_write_text(self.folder / f"part-{n}.bin", data)
        except OSError as e:
            self.error = f"{self.folder}: not written: {e.strerror or e}"
            return False
        self._known |= keys
        self.saved = len(keys)
        return True

    def summary(self) -> dict[str, Any]:
        """The `compile` event's `cache`: what this rank loaded and found, and what rank 0 wrote."""
        return {
            "folder": str(self.folder),
            "loaded": self.loaded,
            **_inductor_counters(),
            "saved": self.saved,
            "error": self.error,
        }


def open_cache(run_dir: Path, device: torch.device, writer: bool) -> CompileCache:
    cache = CompileCache(cache_dir(run_dir, device), writer)
    cache.load()
    return cache
