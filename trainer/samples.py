"""Reconstruction samples a person can look at: a PNG strip per clip (input, reconstruction,
amplified error) and a side-by-side video, written to `RUN/samples/step-<N>/` by validation and
reused by `taehv-console eval` for its contact sheet."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from trainer.synthetic import video_codec, write_video

AMPLIFY = 4  # error rows show |y - x| * AMPLIFY, clipped


@dataclass
class SampleClip:
    index: int  # position in the fixed sample set (0..3)
    source: str  # the video path it came from
    x: torch.Tensor  # T×3×H×W input frames in [0, 1] (any float dtype, any device)
    y: torch.Tensor  # T×3×H×W reconstruction aligned to x (same shape)
    psnr: float


def _check_pair(x: torch.Tensor, y: torch.Tensor, what: str) -> None:
    if x.dim() != 4 or x.shape[1] != 3:
        raise ValueError(f"{what}: input frames must be T×3×H×W, got shape {tuple(x.shape)}")
    if y.shape != x.shape:
        raise ValueError(
            f"{what}: reconstruction shape {tuple(y.shape)} differs from the input's {tuple(x.shape)}"
        )
    if x.shape[0] == 0 or x.shape[2] == 0 or x.shape[3] == 0:
        raise ValueError(f"{what}: empty clip of shape {tuple(x.shape)}")


def _to_u8(frames: torch.Tensor) -> np.ndarray:
    """T×3×H×W in [0, 1] -> T×H×W×3 uint8 (clamped, rounded)."""
    u8 = (frames.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return u8.permute(0, 2, 3, 1).cpu().numpy()


def _row(frames: np.ndarray) -> np.ndarray:
    """T×H×W×3 -> H×(T·W)×3: the frames left to right."""
    t, h, w, c = frames.shape
    return frames.transpose(1, 0, 2, 3).reshape(h, t * w, c)


def strip(x: torch.Tensor, y: torch.Tensor, amplify: int = AMPLIFY) -> np.ndarray:
    """uint8 (3H)×(T·W)×3: row 1 the input frames, row 2 the reconstruction, row 3 the error
    |y - x| × amplify, clipped to [0, 1] (inputs clamped to [0, 1] first)."""
    _check_pair(x, y, "strip")
    xf = x.detach().float().clamp(0, 1)
    yf = y.detach().float().to(xf.device).clamp(0, 1)
    error = ((yf - xf).abs() * amplify).clamp(0, 1)
    return np.concatenate([_row(_to_u8(xf)), _row(_to_u8(yf)), _row(_to_u8(error))], axis=0)


def side_by_side(x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """T×H'×(2W')×3 uint8 frames, input left and reconstruction right, padded (black) to even
    H' and 2W' as yuv420p needs."""
    _check_pair(x, y, "side_by_side")
    frames = np.concatenate([_to_u8(x), _to_u8(y.to(x.device))], axis=2)
    _t, h, w, _ = frames.shape
    return np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN


def write_png(path: Path, image: np.ndarray) -> Path:
    """An H×W×3 uint8 image as PNG, through a temporary name so a reader never sees half of one."""
    partial = path.with_name(f".{path.name}.part")
    try:
        Image.fromarray(np.ascontiguousarray(image)).save(partial, format="PNG")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def write_step_samples(
    run_dir: Path, step: int, clips: Sequence[SampleClip], fps: int = 8
) -> tuple[Path, list[np.ndarray]]:
    """Write `RUN/samples/step-<step>/`: clip-<k>.png (the strip), clip-<k>.mp4 (input |
    reconstruction) and, last, index.json, whose presence means the step is complete.

    Returns the step directory and the strips (in `clips` order), for TensorBoard.
    """
    if not clips:
        raise ValueError(f"write_step_samples: no clips for step {step}")
    indexes = [c.index for c in clips]
    if len(set(indexes)) != len(indexes):
        raise ValueError(f"write_step_samples: clip indexes repeat: {indexes}")
    for clip in clips:
        _check_pair(clip.x, clip.y, f"sample clip {clip.index} ({clip.source})")
    step_dir = Path(run_dir) / "samples" / f"step-{step}"
    step_dir.mkdir(parents=True, exist_ok=True)
    index_path = step_dir / "index.json"
    index_path.unlink(missing_ok=True)  # a rewrite is incomplete until its own index.json lands
    codec = video_codec()
    strips: list[np.ndarray] = []
    entries: list[dict] = []
    for clip in clips:
        image = strip(clip.x, clip.y)
        strips.append(image)
        png = write_png(step_dir / f"clip-{clip.index}.png", image)
        # mp4 with libx264 (mpeg4 where FFmpeg lacks it); Matroska/FFV1 only on a build with neither
        video = write_video(
            step_dir / f"clip-{clip.index}{codec.suffix}", side_by_side(clip.x, clip.y), fps=fps
        )
        t, _, h, w = clip.x.shape
        entries.append(
            {
                "index": clip.index,
                "source": clip.source,
                "psnr": _finite(float(clip.psnr)),
                "png": png.name,
                "video": video.name,
                "frames": t,
                "height": h,
                "width": w,
            }
        )
    partial = step_dir / ".index.json.part"
    partial.write_text(json.dumps({"step": step, "amplify": AMPLIFY, "clips": entries}, indent=1) + "\n")
    os.replace(partial, index_path)
    return step_dir, strips
