"""The teacher latent cache: `taehv-train cache-latents` runs the teacher once over the data, and
training then reads latents from here and never loads the teacher.

Layout of a cache directory:
  manifest.json          what the latents belong to: every clip's path, size and mtime, the frame
                         window and canvas, the teacher's identity; written last, atomically
  clips/<key>.safetensors  one clip's latents [windows, k, C, H/(8p), W/(8p)] (fp16), its frame
                         starts, and (in the header) the clip identity it was made from

How crops line up: each clip is centre-cropped to the canvas aspect ratio and resized to the canvas
(uint8, antialiased), then cut into fixed windows of `frames` frames at frame step `step`. Training
takes a window and a spatial crop whose offsets are multiples of the family's 8·p pixels (one latent
cell: 8 for taehv, 16 for the patch-2 families, 32 for LTX), and
the matching slice of the latents. What that costs in fidelity, against the online teacher: no
random resize, frame step, flip or colour jitter for the encoder target (the latents are of the
unaugmented canvas), a fixed set of windows per clip, and a cropped latent that saw context beyond
the crop (the teacher encoded the whole canvas), so it is not exactly the encode of the crop.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch.utils.data import DataLoader, Dataset

from trainer.config import ConfigError, DataSection, TrainConfig, load_config
from trainer.data import (
    DataSourceError,
    ResumableSampler,
    _count_frames,
    _ignore_stop_signals,
    find_videos,
    read_frames,
)
from trainer.errors import CacheError
from trainer.events import atomic_write_text
from trainer.families import DEFAULT_FAMILY
from trainer.synthetic import parse_size
from trainer.teacher import (
    TeacherError,
    encode,
    load_teacher,
    place_teacher,
    student_latent_frames,
    teacher_identity,
)

CACHE_VERSION = 1
MANIFEST = "manifest.json"
CLIPS = "clips"
# pixels per latent cell of a cache written before families (taehv's): a family's cell is its 8·p
# (clip_rule(...).space_scale, recorded in the manifest), and crop offsets move in whole cells
LATENT_CELL = 8
STORE_DTYPE = torch.float16  # half the disk of fp32; raw HunyuanVideo latents are O(1-10)


@dataclass(frozen=True)
class CacheSpec:
    """Everything besides the clips themselves that the latents depend on."""

    frames: int
    height: int
    width: int
    step: int
    max_windows: int
    latent_channels: int
    teacher: dict

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    @property
    def span(self) -> int:
        return (self.frames - 1) * self.step + 1


def clip_identity(path: Path) -> dict:
    st = path.stat()
    return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def clip_file(path: str) -> str:
    return f"{CLIPS}/{hashlib.sha256(path.encode('utf-8', 'surrogateescape')).hexdigest()[:24]}.safetensors"


def window_starts(n_frames: int, spec: CacheSpec) -> list[int]:
    """Up to max_windows windows spread evenly over the clip, never overlapping."""
    if n_frames < spec.span:
        return []
    count = min(spec.max_windows, n_frames // spec.span)
    if count == 1:
        return [0]
    last = n_frames - spec.span
    return [round(i * last / (count - 1)) for i in range(count)]


def to_canvas(frames: np.ndarray, height: int, width: int) -> torch.Tensor:
    """uint8 [T, H, W, 3] frames -> uint8 [T, 3, height, width]: the largest centred region of the
    canvas aspect ratio, resized in uint8. The cache and training call this one function, so the
    pixels training sees are exactly the ones the teacher encoded."""
    h, w = frames.shape[1:3]
    if w * height >= h * width:
        crop_h, crop_w = h, round(h * width / height)
    else:
        crop_h, crop_w = round(w * height / width), w
    top, left = (h - crop_h) // 2, (w - crop_w) // 2
    x = torch.from_numpy(np.ascontiguousarray(frames[:, top : top + crop_h, left : left + crop_w])).permute(
        0, 3, 1, 2
    )
    if (crop_h, crop_w) != (height, width):
        x = F.interpolate(x, size=(height, width), mode="bilinear", antialias=True, align_corners=False)
    return x.contiguous()


# ------------------------------------------------------------------------------------------ manifest


def read_manifest(cache_dir: Path) -> dict:
    path = Path(cache_dir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CacheError(
            f"{cache_dir}: no latent cache here (no {MANIFEST}); build it with "
            "`taehv-train cache-latents --run RUN`"
        ) from None
    except (OSError, json.JSONDecodeError) as err:
        raise CacheError(
            f"{path}: unreadable ({err}); rebuild it with `taehv-train cache-latents --run RUN`"
        ) from None


def data_differences(manifest: dict, current: list[dict]) -> list[str]:
    """Clips added, removed or changed (size or mtime) since the cache was written."""
    cached = {c["path"]: c for c in manifest.get("clips", [])}
    now = {c["path"]: c for c in current}
    out = [f"added {p}" for p in sorted(now.keys() - cached.keys())]
    out += [f"removed {p}" for p in sorted(cached.keys() - now.keys())]
    for p in sorted(now.keys() & cached.keys()):
        a, b = cached[p], now[p]
        if (a["size"], a["mtime_ns"]) != (b["size"], b["mtime_ns"]):
            out.append(
                f"changed {p} ({a['size']} -> {b['size']} bytes, modified since the cache was written)"
            )
    return out


def open_cache(cache_dir: str | Path, cfg: TrainConfig) -> dict:
    """The manifest of a cache that matches this config's data and settings, checked before any process
    group starts; CacheError says what differs. Reads file metadata only, never a latent."""

    cache_dir = Path(cache_dir).expanduser()
    manifest = read_manifest(cache_dir)
    rebuild = "; run `taehv-train cache-latents --run RUN` to update it (it re-encodes only what changed)"
    if manifest.get("version") != CACHE_VERSION:
        raise CacheError(
            f"{cache_dir}: cache format {manifest.get('version')}, this trainer reads {CACHE_VERSION}"
            + rebuild
        )
    spec = manifest["spec"]
    d = cfg.data
    problems = []
    if spec["frames"] != d.frames:
        problems.append(f"its windows are {spec['frames']} frames, data.frames is {d.frames}")
    if spec["height"] < d.height or spec["width"] < d.width:
        problems.append(
            f"its canvas is {spec['height']}x{spec['width']}, smaller than the training crop "
            f"data.height x data.width = {d.height}x{d.width}"
        )
    family = manifest.get("family", DEFAULT_FAMILY)  # a cache from before families is taehv's
    if family != cfg.model.family:
        problems.append(
            f"its latents are model.family = {family}'s (teacher {spec['teacher'].get('class')}), "
            f"this run's family is {cfg.model.family}"
        )
    if spec["latent_channels"] != cfg.model.latent_channels:
        problems.append(
            f"its latents have {spec['latent_channels']} channels, model.latent_channels is "
            f"{cfg.model.latent_channels}"
        )
    cell = manifest.get("latent_cell", LATENT_CELL)
    if cell != cfg.clip_rule.space_scale:
        problems.append(
            f"its latents are one per {cell}x{cell} pixels, this run's student has one per "
            f"{cfg.clip_rule.space_scale}x{cfg.clip_rule.space_scale}"
        )
    if problems:
        raise CacheError(f"latent cache {cache_dir} does not fit this run: " + "; ".join(problems) + rebuild)
    try:
        videos = find_videos(d.source, d.root)
    except DataSourceError as err:
        raise CacheError(str(err)) from None
    diff = data_differences(manifest, [clip_identity(p) for p in videos])
    if diff:
        shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
        raise CacheError(
            f"latent cache {cache_dir} does not match the data in {d.source}: {len(diff)} clip(s) "
            f"differ: {shown}" + rebuild
        )
    teacher = Path(cfg.loss.teacher).expanduser() if cfg.loss.teacher else None
    if teacher is not None and teacher.is_dir():
        # the teacher is optional once cached; when it is named and present, it must be the one used
        try:
            ident = teacher_identity(teacher, cfg.loss.teacher_subfolder)
        except OSError:
            ident = None
        if ident is not None and ident != spec["teacher"]:
            raise CacheError(
                f"latent cache {cache_dir} was made with another teacher than loss.teacher = "
                f"{str(teacher)!r} (its config or weight files differ)" + rebuild
            )
    missing = [c["file"] for c in manifest["clips"] if c["windows"] and not (cache_dir / c["file"]).is_file()]
    if missing:
        raise CacheError(
            f"latent cache {cache_dir}: {len(missing)} latent file(s) missing, e.g. {missing[0]}" + rebuild
        )
    return manifest


# ------------------------------------------------------------------------------------------ building


def _entry_matches(path: Path, identity: dict, spec_digest: str) -> bool:

    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
    except Exception:  # noqa: BLE001 - unreadable or half-written: encode again
        return False
    return meta.get("spec") == spec_digest and meta.get("clip") == json.dumps(identity, sort_keys=True)


def _frame_count(path: Path) -> int:

    return _count_frames(path)


def encode_clip(
    teacher: Any,
    path: Path,
    spec: CacheSpec,
    device: torch.device | str,
    family: str = DEFAULT_FAMILY,
    cell: int = LATENT_CELL,
    time_scale: int = 4,
) -> tuple[torch.Tensor, list[int]]:
    """Latents [windows, k, C, h / cell, w / cell] of one clip (k as the family's student gives) and
    the windows' first frames. cell, time_scale: the family's 8·p and time scale (a `custom` student's)."""

    starts = window_starts(_frame_count(path), spec)
    out = []
    for s in starts:
        frames = read_frames(path, [s + i * spec.step for i in range(spec.frames)])
        if frames.shape[1] < spec.height or frames.shape[2] < spec.width:
            raise DataSourceError(
                f"{path}: {frames.shape[1]}x{frames.shape[2]} frames are smaller than the cache "
                f"canvas {spec.height}x{spec.width} (sources are never upsampled)"
            )
        video = to_canvas(frames, spec.height, spec.width)[None].to(device).float().div_(255)
        out.append(encode(teacher, video, family, time_scale)[0].to("cpu", STORE_DTYPE))
    if not out:
        return _no_windows(spec, family, cell, time_scale), []
    return torch.stack(out), starts


def _no_windows(spec: CacheSpec, family: str, cell: int, time_scale: int) -> torch.Tensor:
    """The latents of a clip with no window: none, of the shape its windows would have."""
    return torch.zeros(
        0,
        student_latent_frames(family, spec.frames, time_scale),
        spec.latent_channels,
        spec.height // cell,
        spec.width // cell,
        dtype=STORE_DTYPE,
    )


def _write_entry(
    target: Path, latents: torch.Tensor, starts: list[int], identity: dict, spec_digest: str
) -> None:

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    save_file(
        {"latents": latents.contiguous(), "starts": torch.tensor(starts, dtype=torch.int64)},
        str(tmp),
        metadata={"spec": spec_digest, "clip": json.dumps(identity, sort_keys=True)},
    )
    os.replace(tmp, target)


def build_cache(
    cfg: TrainConfig,
    cache_dir: str | Path,
    *,
    rank: int = 0,
    world: int = 1,
    device: str = "cpu",
    height: int | None = None,
    width: int | None = None,
    max_windows: int = 4,
    log: Callable[[str], object] = print,
) -> dict:
    """This rank's share (clips i with i % world == rank) of the cache, skipping clips whose latents
    are already there for the same clip and settings; then, if every clip is done, the manifest.
    Several ranks run it at once without talking to each other: whichever finishes last sees every
    clip done and writes the manifest. Returns {"encoded", "kept", "manifest": bool}."""

    cache_dir = Path(cache_dir).expanduser()
    if not cfg.loss.teacher:
        raise CacheError(
            "loss.teacher is empty: the cache needs the teacher VAE to encode the data "
            "(--set loss.teacher=DIR)"
        )
    videos = find_videos(cfg.data.source, cfg.data.root)
    rule = cfg.clip_rule
    teacher = load_teacher(
        cfg.loss.teacher,
        cfg.loss.teacher_subfolder,
        cfg.model.latent_channels,
        family=cfg.model.family,
        space_scale=rule.space_scale,
        time_scale=rule.time_scale,
    )
    dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    teacher = place_teacher(teacher, device, dtype)
    spec = CacheSpec(
        frames=cfg.data.frames,
        height=height or cfg.data.height,
        width=width or cfg.data.width,
        step=cfg.data.min_delta,
        max_windows=max_windows,
        latent_channels=cfg.model.latent_channels,
        teacher=teacher_identity(cfg.loss.teacher, cfg.loss.teacher_subfolder),
    )
    cell = rule.space_scale  # 8·p: a crop offset that is not a whole cell has no slice of latents
    if spec.height % cell or spec.width % cell:
        raise CacheError(
            f"cache canvas {spec.height}x{spec.width}: both sides must be multiples of {cell} "
            f"(model.family = {cfg.model.family}'s latent cell, 8 x patch {cell // 8})"
        )
    digest = spec.digest()
    identities = [clip_identity(p) for p in videos]
    encoded = kept = 0
    t0 = time.time()
    for i in range(rank, len(videos), world):
        target = cache_dir / clip_file(identities[i]["path"])
        if _entry_matches(target, identities[i], digest):
            kept += 1
            continue
        try:
            latents, starts = encode_clip(
                teacher, videos[i], spec, device, cfg.model.family, cell, rule.time_scale
            )
        except (DataSourceError, OSError, ValueError) as err:
            # recorded as a clip without windows, so the manifest can still be complete and training
            # knows to leave it out rather than stopping at it
            log(f"[cache-latents] rank {rank}: {videos[i]}: no windows ({err})")
            starts = []
            latents = _no_windows(spec, cfg.model.family, cell, rule.time_scale)
        _write_entry(target, latents, starts, identities[i], digest)
        encoded += 1
        log(
            f"[cache-latents] rank {rank}: {encoded + kept}/{len(range(rank, len(videos), world))} "
            f"{videos[i].name}: {len(starts)} window(s), {time.time() - t0:.1f}s"
        )
    done = _finish(cache_dir, spec, identities, digest, log, cfg.model.family, cell)
    return {"encoded": encoded, "kept": kept, "manifest": done}


def _finish(
    cache_dir: Path,
    spec: CacheSpec,
    identities: list[dict],
    digest: str,
    log: Callable[[str], object],
    family: str = DEFAULT_FAMILY,
    cell: int = LATENT_CELL,
) -> bool:
    """Write the manifest when every clip's latents are there (any rank may; the content is the same)."""

    clips = []
    for ident in identities:
        rel = clip_file(ident["path"])
        if not _entry_matches(cache_dir / rel, ident, digest):
            return False
        with safe_open(str(cache_dir / rel), "pt") as f:
            windows = f.get_slice("latents").get_shape()[0]
        clips.append({**ident, "file": rel, "windows": windows})
    wanted = {c["file"] for c in clips}
    for stale in (cache_dir / CLIPS).glob("*.safetensors"):
        if f"{CLIPS}/{stale.name}" not in wanted:  # a clip removed from the data
            stale.unlink(missing_ok=True)
    manifest = {
        "version": CACHE_VERSION,
        "spec": asdict(spec),
        "spec_digest": digest,
        # beside the spec, not in it: a taehv cache written before families keeps its digest
        "family": family,
        "latent_cell": cell,  # pixels per latent a side: crops move in whole cells
        "created": time.time(),
        "clips": clips,
    }
    atomic_write_text(cache_dir / MANIFEST, json.dumps(manifest, indent=1), fsync=True)
    log(
        f"[cache-latents] manifest written: {len(clips)} clips, "
        f"{sum(c['windows'] for c in clips)} windows in {cache_dir}"
    )
    return True


# ------------------------------------------------------------------------------------------ training


class CachedLatentDataset(Dataset):
    """Training items from a cache: a window of a clip at a random latent-aligned crop of
    data.height x data.width, uint8 video [T, 3, h, w] and its float latents [k, C, h/(8p), w/(8p)].
    Items are (index, sample_seed) as for trainer.data's datasets, so resume continues the order."""

    def __init__(
        self, cache_dir: str | Path, manifest: dict, paths: list[Path], data_cfg: DataSection
    ) -> None:
        self.cache_dir = Path(cache_dir).expanduser()
        self.spec = manifest["spec"]
        self.cell = int(manifest.get("latent_cell", LATENT_CELL))  # a cache from before families: taehv's
        self.cfg = data_cfg
        wanted = {str(p) for p in paths}
        self.clips = [c for c in manifest["clips"] if c["path"] in wanted and c["windows"] > 0]
        if not self.clips:
            raise CacheError(
                f"latent cache {self.cache_dir}: none of the {len(wanted)} training clips has a "
                f"window of {self.spec['frames']} frames"
            )
        self.unusable = [c["path"] for c in manifest["clips"] if c["path"] in wanted and c["windows"] == 0]

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, item: tuple[int, int]) -> dict:

        index, seed = item
        clip = self.clips[index]
        rng = np.random.default_rng([seed, 2])
        window = int(rng.integers(0, clip["windows"]))
        cell = self.cell
        top = int(rng.integers(0, (self.spec["height"] - self.cfg.height) // cell + 1)) * cell
        left = int(rng.integers(0, (self.spec["width"] - self.cfg.width) // cell + 1)) * cell
        with safe_open(str(self.cache_dir / clip["file"]), "pt") as f:
            start = int(f.get_slice("starts")[window : window + 1][0])
            lat = f.get_slice("latents")[
                window : window + 1,
                :,
                :,
                top // cell : (top + self.cfg.height) // cell,
                left // cell : (left + self.cfg.width) // cell,
            ][0]
        s = self.spec
        frames = read_frames(Path(clip["path"]), [start + i * s["step"] for i in range(s["frames"])])
        video = to_canvas(frames, s["height"], s["width"])[
            :, :, top : top + self.cfg.height, left : left + self.cfg.width
        ]
        return {"video": video.contiguous(), "latents": lat.float(), "index": index, "skipped": []}


def collate_cached(items: list[dict]) -> dict:
    return {
        "video": torch.stack([it["video"] for it in items]),
        "latents": torch.stack([it["latents"] for it in items]),
        "index": [it["index"] for it in items],
        "skipped": [],
    }


def make_cached_loader(
    dataset: CachedLatentDataset,
    rank: int,
    world: int,
    seed: int,
    batch_size: int,
    start_sample: int,
    num_workers: int,
    prefetch_factor: int,
) -> DataLoader:
    """As trainer.data.make_train_loader, for cached items (latents ride along with the video)."""

    workers = num_workers > 0
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=ResumableSampler(len(dataset), rank, world, seed, start_sample),
        collate_fn=collate_cached,
        num_workers=num_workers,
        persistent_workers=workers,
        prefetch_factor=prefetch_factor if workers else None,
        pin_memory=torch.cuda.is_available(),
        worker_init_fn=_ignore_stop_signals if workers else None,
    )


# ------------------------------------------------------------------------------------------ CLI


def cache_main(run_dir: Path, out: str | None, size: str | None, max_windows: int) -> int:
    """`taehv-train cache-latents`: this process's share, by RANK/WORLD_SIZE (torchrun, accelerate
    launch or srun set them; one process without). Resumable: run it again after any interruption."""

    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    try:
        cfg = load_config(Path(run_dir) / "run.toml")
        cache_dir = out or cfg.loss.teacher_cache
        if not cache_dir:
            raise CacheError("no cache directory: set loss.teacher_cache in run.toml or pass --out DIR")
        height = width = None
        if size:
            height, width = parse_size(size)
        device = "cpu"
        if cfg.topology.device == "cuda" and torch.cuda.is_available():
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
        result = build_cache(
            cfg,
            cache_dir,
            rank=rank,
            world=world,
            device=device,
            height=height,
            width=width,
            max_windows=max_windows,
        )
    except (ConfigError, DataSourceError, CacheError, TeacherError, ValueError) as err:
        print(f"[cache-latents] error: {err}", file=sys.stderr, flush=True)
        return 2
    print(
        f"[cache-latents] rank {rank}/{world}: encoded {result['encoded']}, kept {result['kept']}"
        + ("; manifest complete" if result["manifest"] else "; other ranks still running"),
        flush=True,
    )
    return 0
