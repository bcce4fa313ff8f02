"""Writes small but real video files: textured shapes moving over a panning, noisy background
(make_synthetic), or a camera moving over real photographs (make_photo_clips).

Demos and tests train on these so that they go through the same PyAV decoding path as a user's videos.
"""

from __future__ import annotations

import functools
import io
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np


@dataclass(frozen=True)
class VideoCodec:
    codec: str
    container: str  # FFmpeg muxer name
    suffix: str
    options: dict[str, str]


# Tried in order; FFmpeg builds differ in which encoders they carry. mp4 first because it is what users
# feed the trainer; FFV1 in Matroska is lossless and present in every FFmpeg build we know of.
_CANDIDATES = (
    VideoCodec("libx264", "mp4", ".mp4", {"preset": "ultrafast", "crf": "18"}),
    VideoCodec("h264", "mp4", ".mp4", {}),
    VideoCodec("libopenh264", "mp4", ".mp4", {}),
    VideoCodec("mpeg4", "mp4", ".mp4", {"qmin": "2", "qmax": "4"}),
    VideoCodec("ffv1", "matroska", ".mkv", {}),
)


def _encode(
    target: str | io.BytesIO, codec: VideoCodec, frames: Iterable[np.ndarray], fps: int, gop: int | None
) -> None:
    with av.open(target, "w", format=codec.container) as container:
        stream = None
        for frame in frames:
            if stream is None:
                height, width = frame.shape[:2]
                stream = container.add_stream(codec.codec, rate=fps)
                stream.width, stream.height = width, height
                stream.pix_fmt = "yuv420p" if codec.codec != "ffv1" else "yuv444p"
                stream.options = dict(codec.options)
                if gop is not None:
                    stream.codec_context.gop_size = gop
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        if stream is None:
            raise ValueError("no frames to write")
        for packet in stream.encode():
            container.mux(packet)


@functools.cache
def video_codec() -> VideoCodec:
    """The first candidate codec that really encodes here (an encoder can be listed yet fail to open)."""
    probe = [np.zeros((16, 16, 3), np.uint8)] * 2
    for codec in _CANDIDATES:
        try:
            _encode(io.BytesIO(), codec, probe, 24, None)
        except (av.error.FFmpegError, ValueError):
            continue
        return codec
    raise RuntimeError(
        "PyAV's FFmpeg has none of these video encoders: " + ", ".join(c.codec for c in _CANDIDATES)
    )


def write_video(
    path: Path,
    frames: Iterable[np.ndarray],
    fps: int = 24,
    codec: VideoCodec | None = None,
    gop: int | None = None,
) -> Path:
    """Encode uint8 RGB frames [H, W, 3] (H and W even) into `path`, written under a temporary name first
    so that an interrupted run never leaves a half-written video under a name the data loader picks up."""
    codec = codec or video_codec()
    path = Path(path)
    partial = path.with_name(f".{path.name}.part")
    try:
        _encode(str(partial), codec, frames, fps, gop)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def parse_size(text: str) -> tuple[int, int]:
    """'480x720' -> (480, 720): height first, as in the trainer's config."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or min(int(match[1]), int(match[2])) <= 0:
        raise ValueError(f"size {text!r}: expected HEIGHTxWIDTH with positive whole numbers, e.g. 480x720")
    return int(match[1]), int(match[2])


def _clip_frames(rng: np.random.Generator, frames: int, height: int, width: int) -> Iterable[np.ndarray]:
    """Shapes with soft edges and gentle texture moving over a panning, slowly varying background.

    The spectrum falls with frequency as a natural image's does: most of each frame's energy is in
    its colours and broad shading, then edges, then fine texture and a little sensor noise. A clip
    made of hard checkers and full-contrast stripes would put most of its energy in detail that
    an 8x-downsampling autoencoder can only learn after many thousand steps, and a short run would
    show nothing but the mean colour (measured: 12.2 dB for flat grey, 13.1 for the clip's mean).
    """
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    unit = min(height, width)

    # The background is an analytic texture, so a camera pan is just an offset in its coordinates and
    # sub-pixel motion costs nothing. Wave amplitude falls as 1/frequency.
    n_waves = 5
    cycles = rng.uniform(0.3, 4.0, n_waves)
    freq = (cycles * 2 * np.pi / unit).tolist()
    angle = rng.uniform(0, np.pi, n_waves).tolist()
    phase = rng.uniform(0, 2 * np.pi, n_waves).tolist()
    wave_colour = (rng.uniform(-30, 30, (n_waves, 3)) / np.maximum(cycles, 0.5)[:, None]).astype(np.float32)
    base_colour = rng.uniform(50, 200, 3).astype(np.float32)
    pan = (rng.uniform(-0.04, 0.04, 2) * unit).tolist()  # pixels per frame (y, x)

    n_shapes = int(rng.integers(2, 5))
    shapes = []
    for _ in range(n_shapes):
        shapes.append(
            {
                "round": bool(rng.random() < 0.5),
                "radius": float(rng.uniform(0.12, 0.3) * unit),
                "centre": (rng.uniform(0, 1, 2) * (height, width)).tolist(),
                "velocity": (rng.uniform(-0.06, 0.06, 2) * unit).tolist(),
                "colour": rng.uniform(20, 235, 3).astype(np.float32),
                "stripe": float(rng.uniform(1, 4) * 2 * np.pi / unit),
                "stripe_angle": float(rng.uniform(0, np.pi)),
            }
        )
    noise = float(rng.uniform(1.0, 3.0))

    for t in range(frames):
        y = yy + pan[0] * t
        x = xx + pan[1] * t
        img = np.broadcast_to(base_colour, (height, width, 3))
        for k in range(n_waves):
            proj = math.cos(angle[k]) * x + math.sin(angle[k]) * y
            img = img + np.sin(freq[k] * proj + phase[k])[..., None] * wave_colour[k]
        for s in shapes:
            # Positions bounce between the frame edges, so shapes stay in view for any clip length.
            cy, cx = (_bounce(s["centre"][i] + s["velocity"][i] * t, (height, width)[i]) for i in range(2))
            dy, dx = yy - cy, xx - cx
            if s["round"]:
                outside = np.sqrt(dy**2 + dx**2) - s["radius"]
            else:
                outside = np.maximum(np.abs(dy) - s["radius"], np.abs(dx) - s["radius"] * 0.7)
            cover = np.clip(0.5 - outside, 0, 1)[..., None]  # a one-pixel anti-aliased edge
            proj = math.cos(s["stripe_angle"]) * dx + math.sin(s["stripe_angle"]) * dy
            texture = np.float32(0.88) + np.float32(0.12) * np.sin(s["stripe"] * proj)
            img = img * (1 - cover) + (s["colour"] * texture[..., None]) * cover
        img = img + rng.standard_normal(img.shape, dtype=np.float32) * noise
        yield np.clip(img, 0, 255).round().astype(np.uint8)


def _bounce(position: float, length: int) -> float:
    period = 2 * length
    p = position % period
    return p if p < length else period - p


def _write_clips(
    out_dir: str | Path,
    clips: int,
    frames: int,
    height: int,
    width: int,
    fps: int,
    seed: int,
    prefix: str,
    frames_of: Callable[[np.random.Generator, int, int, int], Iterable[np.ndarray]],
    stream: tuple[int, ...],
    gop: int | None = None,
) -> list[Path]:
    if clips < 1 or frames < 1 or fps < 1:
        raise ValueError(f"clips, frames and fps must be at least 1 (got {clips}, {frames}, {fps})")
    if height < 2 or width < 2 or height % 2 or width % 2:
        # 4:2:0 video, what the mp4 encoders take, needs even sides.
        raise ValueError(f"size {height}x{width}: height and width must be even and at least 2")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    codec = video_codec()
    written = []
    for i in range(clips):
        rng = np.random.default_rng([seed, i, *stream])
        path = out_dir / f"{prefix}-{i:04d}{codec.suffix}"
        written.append(write_video(path, frames_of(rng, frames, height, width), fps, codec, gop))
    return written


def make_synthetic(
    out_dir: Path,
    clips: int,
    frames: int,
    height: int,
    width: int,
    fps: int = 24,
    seed: int = 0,
    gop: int | None = None,
) -> list[Path]:
    """Write `clips` videos of `frames` frames at height x width into out_dir; each clip differs (its
    content comes from seed and the clip's index). Returns the written paths, in order. `gop`: as in
    make_photo_clips."""
    return _write_clips(out_dir, clips, frames, height, width, fps, seed, "clip", _clip_frames, (), gop)


# scikit-image's bundled colour photographs (no download): real textures, edges and colour
# statistics, which the analytic clips above lack.
PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "immunohistochemistry",
    "hubble_deep_field",
    "retina",
    "stereo_motorcycle",
)


@functools.cache
def _photo(name: str) -> np.ndarray:
    try:
        import skimage.data
    except ImportError:
        raise RuntimeError(
            "photo clips need scikit-image (pip install scikit-image, or taehv-console[test])"
        ) from None
    img = getattr(skimage.data, name)()
    if isinstance(img, tuple):  # stereo pairs: the left view
        img = img[0]
    return np.ascontiguousarray(img[..., :3]).astype(np.float32)


def _photo_frames(rng: np.random.Generator, frames: int, height: int, width: int) -> Iterable[np.ndarray]:
    """A camera moving over one photograph: pan, zoom and a little roll along smooth paths, with
    hand-held jitter and sensor noise. Frames are sampled bilinearly from the photo."""
    from scipy.ndimage import map_coordinates

    photo = _photo(PHOTOS[int(rng.integers(len(PHOTOS)))])
    ph, pw = photo.shape[:2]
    # The window's scale (photo pixels per output pixel): as large as half the photo allows, so
    # motion rarely magnifies the photo beyond its own resolution.
    fit = min(ph / height, pw / width)
    scale0 = fit * rng.uniform(0.35, 0.7)
    zoom_rate = rng.uniform(-0.008, 0.008)  # relative change of scale per frame
    roll0, roll_rate = rng.uniform(-0.1, 0.1), rng.uniform(-0.01, 0.01)  # radians
    half = np.array([height, width], np.float64) / 2
    centre0 = np.array([rng.uniform(0.3, 0.7) * ph, rng.uniform(0.3, 0.7) * pw])
    velocity = rng.uniform(-0.008, 0.008, 2) * np.array([ph, pw])  # photo pixels per frame
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    yy, xx = yy - half[0] + 0.5, xx - half[1] + 0.5
    noise = float(rng.uniform(1.0, 3.0))
    for t in range(frames):
        scale = scale0 * (1 + zoom_rate) ** t
        roll = roll0 + roll_rate * t
        shake = rng.normal(0, 0.4, 2) * scale
        centre = centre0 + velocity * t + shake
        # keep the window's centre inside the photo (reflection handles the corners)
        centre = np.clip(centre, half * scale * 0.5, np.array([ph, pw]) - half * scale * 0.5)
        c, s = math.cos(roll), math.sin(roll)
        py = centre[0] + scale * (c * yy - s * xx)
        px = centre[1] + scale * (s * yy + c * xx)
        img = np.stack(
            [map_coordinates(photo[..., k], (py, px), order=1, mode="reflect") for k in range(3)], -1
        )
        img = img + rng.standard_normal(img.shape, dtype=np.float32) * noise
        yield np.clip(img, 0, 255).round().astype(np.uint8)


def make_photo_clips(
    out_dir: Path,
    clips: int,
    frames: int,
    height: int,
    width: int,
    fps: int = 24,
    seed: int = 0,
    gop: int | None = None,
) -> list[Path]:
    """Write `clips` videos of a camera moving over scikit-image's sample photographs (real
    H.264 where PyAV's FFmpeg has an H.264 encoder). Same arguments as make_synthetic; files are
    named photo-NNNN; returns the written paths, in order. `gop`: frames from one keyframe to the
    next (the encoder's default when None)."""
    return _write_clips(out_dir, clips, frames, height, width, fps, seed, "photo", _photo_frames, (1,), gop)
