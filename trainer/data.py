"""Training data: find the videos, hold some out for validation, decode and augment clips with PyAV,
and feed them through a sampler whose order continues exactly across a resume."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import av
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from trainer.augment import NO_JITTER, jitter_factors
from trainer.config import DataSection
from trainer.errors import DataSourceError

if TYPE_CHECKING:
    from av.codec.hwaccel import HWAccel  # PyAV 14 and later
    from av.container import InputContainer
    from av.video.stream import VideoStream

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v")

# Below this start frame a sequential decode from frame 0 costs about what a seek (which lands on an
# earlier keyframe anyway) would, without any of the timestamp bookkeeping.
SEEK_MIN_FRAMES = 48

# How many listed files find_videos checks for existence: enough to catch a wrong data.root at once,
# few enough that a million-entry annotation file on network storage does not stall the start.
_EXISTENCE_PROBE = 32

# Frame threads per decoder. Every data-loader worker of every rank decodes at once, so FFmpeg's
# default (one per core) would put thousands of threads on a GPU node.
_DECODE_THREADS = min(4, os.cpu_count() or 1)


def find_videos(source: str, root: str = "") -> list[Path]:
    """The videos of a data source: a directory scanned recursively, or an annotation JSON
    (`{"list": [{"path": ...}, ...]}`, paths relative to `root`, by default the JSON's folder)."""
    if not str(source).strip():
        raise DataSourceError(
            "no data source given (data.source is empty): set it to a folder of videos or an annotation JSON"
        )
    src = Path(source).expanduser()
    if not src.exists():
        raise DataSourceError(
            f"{src}: data source does not exist (expected a folder of videos or an annotation JSON)"
        )
    if src.is_dir():
        return _scan_directory(src)
    return _read_annotation(src, root)


def _scan_directory(folder: Path) -> list[Path]:
    found = []
    seen_dirs = set()
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        # Datasets are often assembled from symlinked folders; a link back up the tree must not loop.
        real = os.path.realpath(dirpath)
        if real in seen_dirs:
            dirnames[:] = []
            continue
        seen_dirs.add(real)
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            # Hidden files include macOS "._name.mp4" resource forks and our own ".name.mp4.part"
            # files being written: never videos.
            if not name.startswith(".") and name.lower().endswith(VIDEO_EXTENSIONS):
                found.append(Path(dirpath) / name)
    if not found:
        raise DataSourceError(
            f"{folder}: no video files found (searched recursively for {', '.join(VIDEO_EXTENSIONS)})"
        )
    return sorted(found)


def _read_annotation(path: Path, root: str) -> list[Path]:
    shape_hint = 'expected {"list": [{"path": "relative/clip.mp4"}, ...]} or a folder of videos'
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataSourceError(f"{path}: not a valid annotation JSON ({err}); {shape_hint}") from None
    except OSError as err:
        raise DataSourceError(f"{path}: cannot read the annotation file: {err.strerror or err}") from None
    entries = data.get("list") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise DataSourceError(f'{path}: no top-level "list" in the annotation JSON; {shape_hint}')
    if not entries:
        raise DataSourceError(f"{path}: the annotation JSON lists no videos")
    base = Path(root).expanduser() if root else path.parent
    if not base.is_dir():
        raise DataSourceError(f"{base}: the data root (data.root) is not a folder")
    videos = set()
    for i, entry in enumerate(entries):
        rel = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(rel, str) or not rel.strip():
            raise DataSourceError(f'{path}: list[{i}] has no "path" string (got {str(entry)[:80]})')
        videos.add(base / rel)
    result = sorted(videos)
    probe = result[:_EXISTENCE_PROBE]
    # Individual missing files are skipped later like any unreadable video; all of them missing is
    # a wrong root, which the user should hear about before any process starts.
    if not any(p.is_file() for p in probe):
        raise DataSourceError(
            f"{path}: none of the first {len(probe)} listed videos exist under {base} "
            f"(e.g. {probe[0]}); check data.root"
        )
    return result


def split_train_val(
    paths: list[Path], val_fraction: float, val_max_clips: int
) -> tuple[list[Path], list[Path]]:
    """Deterministic held-out split: the clips whose path hash ranks lowest go to validation."""
    n = len(paths)
    k = min(round(n * val_fraction), val_max_clips, n - 1) if n > 1 and val_fraction > 0 else 0
    if k <= 0:
        return list(paths), []
    # Hash paths relative to their common folder, so that moving or remounting the dataset keeps the
    # same split (Python's hash() is salted per process, so every rank would disagree).
    try:
        base = os.path.commonpath([str(p) for p in paths])
    except ValueError:
        base = ""

    def rank_key(p: Path) -> tuple[bytes, str]:
        rel = os.path.relpath(p, base) if base else str(p)
        rel = rel.replace(os.sep, "/")
        return hashlib.sha256(rel.encode("utf-8", "surrogateescape")).digest(), rel

    held_out = set(sorted(paths, key=rank_key)[:k])
    return [p for p in paths if p not in held_out], [p for p in paths if p in held_out]


class _Unusable(Exception):
    """This video cannot give a clip; the message is the reason a user sees."""


class _ShortRead(Exception):
    """The stream ended before the requested frames; `frames` is how many it really has."""

    def __init__(self, frames: int):
        super().__init__(f"the stream ends after {frames} frames")
        self.frames = frames


class _SeekUnreliable(Exception):
    """Timestamps after a seek do not map cleanly to frame numbers: decode from the start instead."""


def _open_video(path: Path, hwaccel: HWAccel | None = None) -> tuple[InputContainer, VideoStream]:
    # hwaccel: a PyAV HWAccel (benchmarks/decoders.py's NVDEC row); PyAV before 14 has no such option
    container = av.open(str(path)) if hwaccel is None else av.open(str(path), hwaccel=hwaccel)
    if not container.streams.video:
        container.close()
        raise _Unusable("no video stream")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    stream.codec_context.thread_count = _DECODE_THREADS
    return container, stream


def _header_frame_count(container: InputContainer, stream: VideoStream) -> int:
    """Frames according to the container (0 when it does not say); may be off, so reads verify it."""
    if stream.frames:
        return int(stream.frames)
    rate = stream.average_rate or stream.guessed_rate
    if not rate:
        return 0
    if stream.duration and stream.time_base:
        seconds = Fraction(stream.duration) * stream.time_base
    elif container.duration:
        seconds = Fraction(container.duration, av.time_base)
    else:
        return 0
    return max(0, round(seconds * rate))


def _sequential_frames(container: InputContainer, stream: VideoStream) -> Iterator[tuple[int, av.VideoFrame]]:
    # The frame number is the decode order count: the definition every other path must agree with.
    yield from enumerate(container.decode(stream))


def _frames_after_seek(
    container: InputContainer, stream: VideoStream, first: int
) -> Iterator[tuple[int, av.VideoFrame]]:
    rate = stream.average_rate
    if not rate or stream.guessed_rate != rate:
        raise _SeekUnreliable("no constant frame rate")
    # Frame 0's own timestamp anchors the mapping; stream.start_time is not always frame 0's.
    head = next(container.decode(stream), None)
    if head is None or head.pts is None or head.time_base is None:
        raise _SeekUnreliable("no timestamps")
    origin, time_base = head.pts, head.time_base
    container.seek(origin + math.floor(Fraction(first) / rate / time_base), stream=stream, backward=True)
    previous = None
    for frame in container.decode(stream):
        if frame.pts is None or frame.time_base != time_base:
            raise _SeekUnreliable("frame without a usable timestamp")
        position = (frame.pts - origin) * time_base * rate
        index = round(position)
        if abs(position - index) > Fraction(1, 4):
            raise _SeekUnreliable("timestamps are not on the frame grid")
        if previous is None and index > first:
            raise _SeekUnreliable("the seek went past the first wanted frame")
        if previous is not None and index != previous + 1:
            raise _SeekUnreliable("timestamps skip or repeat a frame")
        previous = index
        yield index, frame
    if previous is None:
        # Without a single frame there is no position to trust, nor a length to report.
        raise _SeekUnreliable("nothing decoded after the seek")


def _collect(numbered: Iterator[tuple[int, av.VideoFrame]], wanted: list[int]) -> dict[int, np.ndarray]:
    targets, last_wanted = set(wanted), max(wanted)
    found: dict[int, np.ndarray] = {}
    count = 0
    for index, frame in numbered:
        count = index + 1
        if index in targets:
            # threads=1: a loader worker is one core (data.num_workers), and swscale's automatic
            # threads started a pool for each frame's converter (~15 % more CPU measured here); a
            # forked worker once hung in CI waiting on that pool (pthread_cond_wait under to_ndarray)
            found[index] = frame.to_ndarray(format="rgb24", threads=1)
        if index >= last_wanted:
            break
    if len(found) < len(targets):
        raise _ShortRead(count)
    return found


def _read_frames(
    path: Path,
    container: InputContainer,
    stream: VideoStream,
    indices: list[int],
    allow_seek: bool,
    hwaccel: HWAccel | None = None,
) -> list[np.ndarray]:
    """Exactly the frames numbered `indices` (in decode order from 0) as RGB arrays, using the open,
    not yet decoded container; raises _ShortRead when the video has fewer frames."""
    if allow_seek and min(indices) >= SEEK_MIN_FRAMES:
        try:
            found = _collect(_frames_after_seek(container, stream, min(indices)), indices)
            return [found[i] for i in indices]
        except _SeekUnreliable:
            pass
        # The container was decoded partway: start again from a fresh one.
        container, stream = _open_video(path, hwaccel)
        with container:
            found = _collect(_sequential_frames(container, stream), indices)
            return [found[i] for i in indices]
    found = _collect(_sequential_frames(container, stream), indices)
    return [found[i] for i in indices]


def read_frames(
    path: Path, indices: list[int], allow_seek: bool = True, hwaccel: HWAccel | None = None
) -> np.ndarray:
    """Frames `indices` of a video as uint8 [len, H, W, 3]; frame numbers count decoded frames from 0.
    `hwaccel`: a PyAV `HWAccel` to decode with (NVDEC: `HWAccel("cuda")`); frames come back to host
    memory either way. Opening raises PyAV's error where the device is not there."""
    container, stream = _open_video(Path(path), hwaccel)
    with container:
        return np.stack(_read_frames(Path(path), container, stream, list(indices), allow_seek, hwaccel))


def _count_frames(path: Path) -> int:
    container, stream = _open_video(path)
    with container:
        return sum(1 for _ in container.decode(stream))


class VideoClipDataset(Dataset):
    """Clips of cfg.frames frames at cfg.height x cfg.width: items are dicts with "video" uint8
    [T, 3, H, W], "jitter" (brightness, contrast, saturation factors for trainer.augment), "crop"
    (top, left, view height, view width, flipped: see CropBox), "index" and "skipped".

    Items are (index, sample_seed): everything random about a clip comes from sample_seed, so a clip
    can be reproduced in any worker or after a resume. A video that cannot give a clip is remembered
    as bad and the next index is tried instead. `crop_grid` > 1 puts crop offsets on that grid of the
    scaled frame at a fixed scale (8: the latent grid, for cached teacher latents).
    """

    def __init__(self, paths: list[Path], cfg: DataSection, train: bool, crop_grid: int = 1):
        if crop_grid < 1:
            raise ValueError(f"crop_grid must be at least 1, got {crop_grid}")
        self.paths = [Path(p) for p in paths]
        self.cfg = cfg
        self.train = train
        self.crop_grid = crop_grid
        self._bad: dict[int, str] = {}
        # True frame counts, learnt where the container's count was missing or wrong. Only a shortcut:
        # the clip chosen never depends on whether a count is cached (workers each have their own).
        self._frame_counts: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def bad(self) -> dict[str, str]:
        """Videos this instance found unusable: path -> reason."""
        return {str(self.paths[i]): reason for i, reason in self._bad.items()}

    def __getitem__(self, item: tuple[int, int] | int) -> dict:
        index, seed = (item, 0) if isinstance(item, int) else item
        n = len(self.paths)
        if not 0 <= index < n:
            raise IndexError(f"clip index {index} out of range for {n} videos")
        skipped: list[dict] = []
        tried: list[str] = []
        for _ in range(min(self.cfg.max_skip_per_item, n)):
            if index in self._bad:
                # Reported when it was found bad; reporting it again each epoch would only repeat that.
                reason = self._bad[index]
            else:
                try:
                    clip = self._load(index, seed)
                except _Unusable as err:
                    reason = str(err)
                except (av.error.FFmpegError, OSError) as err:
                    reason = f"cannot decode: {err}"
                else:
                    return {**clip, "index": index, "skipped": skipped}
                self._bad[index] = reason
                skipped.append({"path": str(self.paths[index]), "reason": reason})
            tried.append(f"{self.paths[index]} ({reason})")
            index = (index + 1) % n
        raise DataSourceError(
            f"{len(tried)} videos in a row gave no clip: " + "; ".join(tried) + ". Fix or remove them, "
            f"or raise data.max_skip_per_item (now {self.cfg.max_skip_per_item}) to tolerate longer runs"
        )

    def _needed_frames(self) -> int:
        return (self.cfg.frames - 1) * self.cfg.min_delta + 1

    def _too_short(self, frames: int) -> _Unusable:
        cfg = self.cfg
        return _Unusable(
            f"too short: {frames} frames, a clip of {cfg.frames} frames at step {cfg.min_delta} "
            f"needs {self._needed_frames()}"
        )

    def _pick_frames(self, frames: int, seed: int) -> list[int]:
        cfg = self.cfg
        if not self.train:
            return [i * cfg.min_delta for i in range(cfg.frames)]
        # A fresh generator per call: a second pick (after learning the true length) draws the same numbers.
        rng = np.random.default_rng([seed, 0])
        widest = min(cfg.max_delta, (frames - 1) // (cfg.frames - 1))
        delta = int(rng.integers(cfg.min_delta, widest + 1))
        start = int(rng.integers(0, frames - (cfg.frames - 1) * delta))
        return [start + i * delta for i in range(cfg.frames)]

    def _load(self, index: int, seed: int) -> dict:
        path = self.paths[index]
        need = self._needed_frames()
        container, stream = _open_video(path)
        with container:
            if not self.train:
                try:
                    frames = _read_frames(
                        path, container, stream, self._pick_frames(need, seed), allow_seek=False
                    )
                except _ShortRead as short:
                    raise self._too_short(short.frames) from None
                return self._finish(frames, seed)
            # The clip is picked from the container's frame count, and re-picked from the true count only
            # when the first pick runs past the end. Both counts are properties of the file, so the same
            # (index, seed) gives the same clip whatever this instance has cached.
            claimed = _header_frame_count(container, stream)
            known = self._frame_counts.get(index)
            if claimed >= need:
                indices = self._pick_frames(claimed, seed)
                if known is None or indices[-1] < known:
                    try:
                        return self._finish(
                            _read_frames(path, container, stream, indices, allow_seek=True), seed
                        )
                    except _ShortRead as short:
                        known = self._frame_counts[index] = short.frames
        # Missing or too small a claimed count: count for real (cheap when the video really is short).
        if known is None:
            known = self._frame_counts[index] = _count_frames(path)
        if known < need:
            raise self._too_short(known)
        container, stream = _open_video(path)
        with container:
            try:
                frames = _read_frames(
                    path, container, stream, self._pick_frames(known, seed), allow_seek=True
                )
            except _ShortRead as short:
                raise _Unusable(
                    f"decodes inconsistently: {known} frames counted, then {short.frames}"
                ) from None
        return self._finish(frames, seed)

    def crop_box(self, height: int, width: int, rng: np.random.Generator | None) -> CropBox:
        """Where this item's crop lies in a height x width source (random from `rng` when training).
        A subclass (e.g. a cached-latent dataset) may override it to pin the geometry."""
        return crop_box(height, width, self.cfg, rng, grid=self.crop_grid)

    @property
    def crops_per_item(self) -> int:
        """Training crops cut from each decoded clip (data.crops_per_clip; validation takes one)."""
        return self.cfg.crops_per_clip if self.train else 1

    def augmentation(
        self, height: int, width: int, seed: int, crop: int = 0
    ) -> tuple[CropBox, tuple[float, float, float]]:
        """The crop of a height x width source and the colour-jitter factors for item seed `seed`
        (its `crop`-th crop when data.crops_per_clip > 1; the first draws as a single crop does)."""
        rng = np.random.default_rng([seed, 1] if crop == 0 else [seed, 1, crop]) if self.train else None
        box = self.crop_box(height, width, rng)
        # Drawn after the crop from the same generator, in the order the CPU jitter drew them.
        factors = jitter_factors(rng, self.cfg.color_jitter) if rng is not None else NO_JITTER
        return box, factors

    def _finish(self, frames: list[np.ndarray], seed: int) -> dict:
        """Crop, resize (down only) and flip decoded RGB frames into uint8 [T, 3, H, W], all in uint8:
        the float work (colour jitter) happens on the rank's device (trainer.augment). With
        data.crops_per_clip = K > 1 the item holds K crops of the same frames, [K, T, 3, H, W], each
        with its own window, flip and jitter: the decode, the loader's main cost, is shared."""
        height, width = frames[0].shape[:2]
        if any(f.shape != frames[0].shape for f in frames):
            raise _Unusable("frame size changes within the video")
        k = self.crops_per_item
        if k == 1:
            return self._crop(frames, height, width, seed, 0)
        crops = [self._crop(frames, height, width, seed, c) for c in range(k)]
        return {key: torch.stack([c[key] for c in crops]) for key in crops[0]}

    def _crop(self, frames: list[np.ndarray], height: int, width: int, seed: int, crop: int) -> dict:
        cfg = self.cfg
        box, factors = self.augmentation(height, width, seed, crop)
        out = (cfg.height, cfg.width)
        if box.exact and box.view != (height, width):
            # Latent-aligned crops: resize whole frames to the view, so each crop is exactly a window of it.
            x = _resize_u8(np.stack(frames), box.view)
            x = x[:, :, box.top : box.top + cfg.height, box.left : box.left + cfg.width]
        else:
            top, left, rh, rw = box.source_region(height, width, out)
            x = _resize_u8(np.stack([f[top : top + rh, left : left + rw] for f in frames]), out)
        if box.flip:
            x = x.flip(-1)  # torch's flip: numpy copies a mirrored view ~8x slower
        return {
            "video": x,  # collate stacks (copies) anyway: no need for a contiguous copy here
            "jitter": torch.tensor(factors, dtype=torch.float32),
            "crop": torch.tensor([box.top, box.left, *box.view, int(box.flip)], dtype=torch.int64),
        }


def _resize_u8(clip: np.ndarray, size: tuple[int, int]) -> torch.Tensor:
    """uint8 [T, h, w, 3] to uint8 [T, 3, H, W] (antialiased bilinear when the size changes). torch's
    uint8 kernel works on channels-last data: the permuted view of the frames is exactly that."""
    x = torch.from_numpy(clip).permute(0, 3, 1, 2)
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)


@dataclass(frozen=True)
class CropBox:
    """One clip's crop: a cfg.height x cfg.width window at (top, left) of the source scaled to `view`
    (height, width; never larger than the source), flipped or not. `exact`: the window must be exactly
    that window of the whole resized view (latent-aligned crops), not a resize of a source region."""

    top: int
    left: int
    view: tuple[int, int]
    flip: bool
    exact: bool = False

    def source_region(self, height: int, width: int, out: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, left, rows, cols) of the source that the window covers, rounded to whole pixels."""
        sy, sx = height / self.view[0], width / self.view[1]
        rows, cols = min(height, round(out[0] * sy)), min(width, round(out[1] * sx))
        top, left = min(height - rows, round(self.top * sy)), min(width - cols, round(self.left * sx))
        return top, left, rows, cols


def crop_box(
    height: int, width: int, cfg: DataSection, rng: np.random.Generator | None, grid: int = 1
) -> CropBox:
    """The crop of a height x width source: random when `rng` is given (training), centred otherwise.

    The source is scaled by s <= 1 (never up) and a cfg.height x cfg.width window is cut from it.
    The base scale brings the frame to cfg.frame_height (0: makes the source's largest region of
    the window's aspect ratio exactly the window, a resize-crop); training zooms in by 1/r with r
    uniform in [min_crop_scale, 1], stopping at the source's own pixels. With grid > 1 the scale
    stays at the base and offsets are multiples of `grid` (window on a cached latent grid).
    """
    out_h, out_w = cfg.height, cfg.width
    if height < out_h or width < out_w:
        raise _Unusable(
            f"frames of {height}x{width} are smaller than the {out_h}x{out_w} training crop "
            "(height x width); sources are never upsampled"
        )
    fit = max(out_h / height, out_w / width)  # the scale at which the crop just fits
    base = max(fit, min(1.0, cfg.frame_height / height)) if cfg.frame_height else fit
    scale = base
    if rng is not None and grid == 1:
        scale = min(1.0, base / rng.uniform(cfg.min_crop_scale, 1.0))
    view = (max(out_h, round(height * scale)), max(out_w, round(width * scale)))
    room_h, room_w = (view[0] - out_h) // grid, (view[1] - out_w) // grid
    if rng is not None:
        top, left = int(rng.integers(0, room_h + 1)) * grid, int(rng.integers(0, room_w + 1)) * grid
        flip = bool(rng.random() < 0.5) and cfg.flip
    else:
        top, left, flip = room_h // 2 * grid, room_w // 2 * grid, False
    return CropBox(top, left, view, flip, exact=grid > 1)


def _sample_seed(seed: int, rank: int, position: int) -> int:
    # not the rank: `position` is already global, and leaving the rank out gives a sample the same
    # augmentation at any world size (a resume at another world size continues the same data)
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # 63 bits: valid for numpy and torch generators alike


class ResumableSampler(Sampler):
    """An endless stream of (index, sample_seed) for one rank.

    Epoch e is a permutation of range(n) from seed + e, padded by wrapping to a multiple of `world`
    and dealt out as perm[rank::world]. `start` counts the samples this rank already consumed, so a
    resumed run continues the same order; finding that position is arithmetic, no data is touched.
    """

    def __init__(self, n: int, rank: int, world: int, seed: int, start: int = 0):
        if n < 1:
            raise ValueError("ResumableSampler needs at least one item")
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a world of {world}")
        if start < 0 or seed < 0:
            raise ValueError(f"start and seed must not be negative (got {start}, {seed})")
        self.n, self.rank, self.world, self.seed, self.start = n, rank, world, seed, start
        self.per_rank = math.ceil(n / world)
        self._shard_epoch = -1
        self._shard = np.empty(0, dtype=np.int64)

    def _epoch_shard(self, epoch: int) -> np.ndarray:
        if epoch != self._shard_epoch:
            perm = np.random.default_rng(self.seed + epoch).permutation(self.n)
            padded = np.resize(perm, self.per_rank * self.world)  # np.resize repeats, i.e. wraps
            self._shard, self._shard_epoch = padded[self.rank :: self.world], epoch
        return self._shard

    def item_at(self, position: int) -> tuple[int, int]:
        """The (index, sample_seed) this rank draws as its position-th sample (0-based)."""
        epoch, offset = divmod(position, self.per_rank)
        index = int(self._epoch_shard(epoch)[offset])
        global_position = (epoch * self.per_rank + offset) * self.world + self.rank
        return index, _sample_seed(self.seed, self.rank, global_position)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        position = self.start
        while True:
            yield self.item_at(position)
            position += 1


def collate_clips(items: list[dict]) -> dict:
    """A batch of items; an item of K crops (data.crops_per_clip) adds K clips to it. "index" has
    one entry per item: what the sampler handed out, which is what a resume counts."""

    def clips(key: str, ndim: int) -> torch.Tensor:
        return torch.cat([it[key] if it[key].ndim == ndim + 1 else it[key].unsqueeze(0) for it in items])

    return {
        "video": clips("video", 4),
        "jitter": clips("jitter", 1),
        "crop": clips("crop", 1),
        "index": [it["index"] for it in items],
        "skipped": [s for it in items for s in it["skipped"]],
    }


def _ignore_stop_signals(_worker_id: int) -> None:
    """Loader workers share their rank's process group, so a stop (SIGTERM to the group) reaches
    them too; they must outlive it so the rank can finish its step and checkpoint. The rank shuts
    them down itself when it exits."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def make_train_loader(
    dataset: VideoClipDataset,
    rank: int,
    world: int,
    seed: int,
    batch_size: int,
    start_sample: int,
    num_workers: int,
    prefetch_factor: int,
) -> DataLoader:
    """An endless loader of batches {"video": uint8 [B, T, 3, H, W], "jitter": [B, 3], "crop": [B, 5],
    "index", "skipped"} that starts after the `start_sample` samples (items) this rank has already
    consumed. B = `batch_size` clips: batch_size / data.crops_per_clip items of that many crops each."""
    workers = num_workers > 0
    per_item = dataset.crops_per_item
    if batch_size % per_item:
        raise ValueError(f"a batch of {batch_size} clips is not a whole number of items of {per_item} crops")
    return DataLoader(
        dataset,
        batch_size=batch_size // per_item,
        sampler=ResumableSampler(len(dataset), rank, world, seed, start_sample),
        collate_fn=collate_clips,
        num_workers=num_workers,
        persistent_workers=workers,
        prefetch_factor=prefetch_factor if workers else None,
        pin_memory=torch.cuda.is_available(),
        worker_init_fn=_ignore_stop_signals if workers else None,
    )


def validation_items(n_val: int, rank: int, world: int) -> list[tuple[int, int, bool]]:
    """(index, seed, counts) for this rank: indices rank::world, padded with repeats (counts=False)
    so that every rank runs the same number of forward passes, which ZeRO-3's gathers require."""
    if n_val <= 0:
        return []
    per_rank = math.ceil(n_val / world)
    mine = [(i, 0, True) for i in range(rank, n_val, world)]
    filler = mine[0][0] if mine else rank % n_val
    return mine + [(filler, 0, False)] * (per_rank - len(mine))
