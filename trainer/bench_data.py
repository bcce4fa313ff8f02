"""What the data path costs: prepares clips in one process exactly as training does (same dataset,
crop and resize, then the device-side jitter run on the CPU), and turns CPU-s per clip into the
loader workers a GPU needs. `taehv-train bench-data` and the console's preflight both use it."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import av
import numpy as np
import torch

from trainer.augment import to_model_input
from trainer.config import DataSection
from trainer.data import ResumableSampler, VideoClipDataset, collate_clips

# One H100 at 40 % MFU: 989 TFLOP/s dense bf16 x 0.4 / 6.1 TFLOP per 12x480x720 training step.
H100_CLIPS_PER_S = 989 * 0.4 / 6.1
REFERENCE_CLIP = (12, 480, 720)


def default_target_clips_per_s(frames: int, height: int, width: int) -> float:
    """The H100 figure scaled to another clip size (every layer's cost is linear in T x H x W)."""
    f, h, w = REFERENCE_CLIP
    return H100_CLIPS_PER_S * (f * h * w) / (frames * height * width)


@dataclass(frozen=True)
class LoaderCost:
    clips: int
    frames: int
    height: int
    width: int
    load_cpu_s: float  # per clip: decode, crop, resize and flip (a loader worker's work)
    decode_cpu_s: float  # the part of load_cpu_s before cropping: decode, RGB conversion (and collate)
    jitter_cpu_s: float  # per clip: float conversion and colour jitter (on the device in training)
    wall_s: float  # per clip, loading only
    source: str  # codec and size of the first video, e.g. "h264 854x480"
    skipped: tuple[str, ...] = ()
    crops_per_clip: int = 1  # clips cut from each decode (the per-clip figures share one decode)

    @property
    def clips_per_s_per_worker(self) -> float:
        return 1.0 / self.load_cpu_s if self.load_cpu_s > 0 else math.inf

    def workers_for(self, clips_per_s: float) -> int:
        """Loader workers (one core each: DataLoader workers run torch single-threaded) for that rate."""
        return max(1, math.ceil(clips_per_s * self.load_cpu_s))

    def to_dict(self) -> dict:
        return {**asdict(self), "skipped": list(self.skipped)}


class _TimedDataset(VideoClipDataset):
    """The training dataset, with the time spent after decoding (crop, resize, flip) added up."""

    finish_cpu_s = 0.0

    def _finish(self, frames: list[np.ndarray], seed: int) -> dict:
        t0 = time.process_time()
        try:
            return super()._finish(frames, seed)
        finally:
            self.finish_cpu_s += time.process_time() - t0


def _describe(path: Path) -> str:

    try:
        with av.open(str(path)) as c:
            s = c.streams.video[0]
            return f"{s.codec_context.name} {s.height}x{s.width}"
    except Exception as err:  # noqa: BLE001 - only a label: the benchmark itself reports unusable videos
        return f"unreadable ({type(err).__name__})"


def measure_loader(paths: list[Path], cfg: DataSection, clips: int, seed: int = 0) -> LoaderCost:
    """Prepare `clips` training items (after one unmeasured warm-up item) and report CPU-s per
    training clip. With data.crops_per_clip = K each item is one decode cut into K clips, and every
    figure is per clip of the K: what a GPU consumes.

    Process CPU time counts every thread (FFmpeg's decode threads too), which is what a node's cores
    pay; torch runs single-threaded as in a DataLoader worker.
    """
    if clips < 1:
        raise ValueError(f"clips must be at least 1, got {clips}")
    ds = _TimedDataset(paths, cfg, train=True)
    sampler = iter(ResumableSampler(len(ds), 0, 1, seed))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ds[next(sampler)]  # codec and allocator start-up are not per-clip costs
        ds.finish_cpu_s = 0.0
        items = []
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(clips):
            # collate runs in the worker too (a copy of the clip into the batch)
            items.append(collate_clips([ds[next(sampler)]]))
        load_cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
        jitter_cpu = 0.0
        for it in items:
            t0 = time.process_time()
            to_model_input(it["video"], torch.float32, it["jitter"])
            jitter_cpu += time.process_time() - t0
    finally:
        torch.set_num_threads(threads)
    skipped = tuple(f"{s['path']}: {s['reason']}" for it in items for s in it["skipped"])
    made = sum(it["video"].shape[0] for it in items)  # clips: crops_per_clip per decoded clip
    return LoaderCost(
        clips=made,
        frames=cfg.frames,
        height=cfg.height,
        width=cfg.width,
        load_cpu_s=load_cpu / made,
        decode_cpu_s=max(0.0, load_cpu - ds.finish_cpu_s) / made,
        jitter_cpu_s=jitter_cpu / made,
        wall_s=wall / made,
        source=_describe(Path(paths[0])),
        skipped=skipped,
        crops_per_clip=ds.crops_per_item,
    )


def report_lines(
    cost: LoaderCost, target_clips_per_s: float, target_why: str, workers: int | None = None
) -> list[str]:
    need = cost.workers_for(target_clips_per_s)
    crop_s = cost.load_cpu_s - cost.decode_cpu_s
    lines = [
        f"{cost.clips} clips of {cost.frames}x{cost.height}x{cost.width} from {cost.source} sources"
        + (f" ({cost.crops_per_clip} crops per decoded clip)" if cost.crops_per_clip > 1 else ""),
        (
            f"  loader (decode, crop, resize; uint8): {cost.load_cpu_s:.3f} CPU-s per clip "
            f"(decode and RGB {cost.decode_cpu_s:.3f}, crop/resize/flip {crop_s:.3f}), "
            f"{cost.wall_s:.3f} s wall"
        ),
        (
            "  jitter (float + colour; on the GPU in training, here on the CPU): "
            f"{cost.jitter_cpu_s:.3f} CPU-s per clip"
        ),
        f"  one worker: {cost.clips_per_s_per_worker:.1f} clips/s",
        (
            f"  at {target_clips_per_s:.1f} clips/s per GPU ({target_why}): {need} loader worker(s) per GPU "
            f"(data.num_workers = {need})"
        ),
    ]
    if workers is not None:
        rate = workers * cost.clips_per_s_per_worker
        verdict = "enough" if rate >= target_clips_per_s else f"too few: set data.num_workers = {need}"
        lines.append(f"  data.num_workers = {workers} gives {rate:.1f} clips/s per GPU: {verdict}")
    if cost.skipped:
        lines.append(f"  skipped {len(cost.skipped)} video(s): " + "; ".join(cost.skipped[:3]))
    return lines
