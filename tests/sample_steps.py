"""Reconstruction samples laid out as validation writes them (RUN/samples/step-<N>/: clip-<k>.png
strips, clip-<k>.mp4 side-by-side videos, index.json last), made here from numpy frames with
Pillow and PyAV, so the console's tests need no trainer. Every pixel is a function of (step, clip):
the same call always writes the same files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image

from trainer.synthetic import write_video

AMPLIFY = 4


def _frames(clip: int, frames: int, height: int, width: int) -> np.ndarray:
    """T×H×W×3 uint8: a coloured gradient with a bright square moving right, one hue per clip."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack(
        [
            120 + 100 * np.sin(x / width * np.pi + clip),
            80 + 120 * (y / height),
            160 - 100 * np.cos(x / width * np.pi * (clip + 1) / 2),
        ],
        axis=-1,
    )
    out = np.repeat(base[None], frames, axis=0)
    side = max(2, height // 3)
    for t in range(frames):
        left = (t * width // max(frames, 1)) % max(1, width - side)
        out[t, height // 3 : height // 3 + side, left : left + side] = 245
    return out.clip(0, 255).astype(np.uint8)


def _row(frames: np.ndarray) -> np.ndarray:
    t, h, w, c = frames.shape
    return frames.transpose(1, 0, 2, 3).reshape(h, t * w, c)


def write_sample_step(
    run_dir: Path,
    step: int,
    clips: int = 4,
    frames: int = 4,
    height: int = 24,
    width: int = 32,
    complete: bool = True,
    videos: bool = True,
) -> Path:
    """Write RUN/samples/step-<step>/ and return it; `complete=False` leaves out index.json, as a
    step still being written looks. PSNR rises with the step and falls with the clip index."""
    step_dir = Path(run_dir) / "samples" / f"step-{step}"
    step_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for k in range(clips):
        x = _frames(k, frames, height, width)
        # the "reconstruction": the input darkened and smeared, less so at later steps
        blur = max(1, 6 - step // 20)
        y = (np.roll(x, blur, axis=2).astype(np.float32) * 0.85).astype(np.uint8)
        err = (np.abs(y.astype(np.int16) - x.astype(np.int16)) * AMPLIFY).clip(0, 255).astype(np.uint8)
        strip = np.concatenate([_row(x), _row(y), _row(err)], axis=0)
        Image.fromarray(strip).save(step_dir / f"clip-{k}.png")
        if videos:
            write_video(step_dir / f"clip-{k}.mp4", (np.concatenate([a, b], axis=1) for a, b in zip(x, y)))
        entries.append(
            {
                "index": k,
                "source": f"/data/videos/clip-{k}.mp4",
                "psnr": round(18.0 + step / 10 - k * 0.5, 2),
                "png": f"clip-{k}.png",
                "video": f"clip-{k}.mp4" if videos else None,
                "frames": frames,
                "height": height,
                "width": width,
            }
        )
    if complete:
        (step_dir / "index.json").write_text(
            json.dumps({"step": step, "amplify": AMPLIFY, "clips": entries}, indent=1) + "\n"
        )
    return step_dir
