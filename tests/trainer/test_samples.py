"""Samples written at validation: the strip's rows are exactly the input, the reconstruction and the
amplified error; the video decodes to the clip; index.json lists every file and lands last."""

from __future__ import annotations

import json

import av
import numpy as np
import pytest
import torch
from PIL import Image

from trainer.samples import AMPLIFY, SampleClip, side_by_side, strip, write_step_samples


def smooth_clip(t: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """T×3×H×W in [0, 1] on the 1/255 grid: moving colour gradients a video codec keeps well."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    frames = []
    for i in range(t):
        phase = rng.uniform(0, 2 * np.pi, 3)
        chans = [
            0.5 + 0.4 * np.sin((xx + 2 * i) / (14 + 5 * c) + yy / (18 + 3 * c) + phase[c]) for c in range(3)
        ]
        frames.append(np.stack(chans))
    return torch.from_numpy(np.round(np.stack(frames) * 255) / 255).float()


def as_u8(frames: np.ndarray) -> np.ndarray:
    return np.round(np.clip(frames, 0, 1) * 255).astype(np.uint8)


def row(frames: np.ndarray) -> np.ndarray:
    """T×3×H×W floats -> H×(T·W)×3 uint8, frames left to right (written independently of samples.py)."""
    return np.concatenate([as_u8(f).transpose(1, 2, 0) for f in frames], axis=1)


def test_strip_rows_are_input_reconstruction_and_amplified_error():
    x = smooth_clip(5, 16, 24)
    y = (x + torch.randint(-6, 7, x.shape) / 255).clamp(0, 1)
    y[2, :, 4:8, 4:8] = 1.0  # one large error so clipping shows
    image = strip(x, y)
    assert image.dtype == np.uint8 and image.shape == (3 * 16, 5 * 24, 3)
    xn, yn = x.numpy(), y.numpy()
    np.testing.assert_array_equal(image[:16], row(xn))
    np.testing.assert_array_equal(image[16:32], row(yn))
    np.testing.assert_array_equal(image[32:], row(np.abs(yn - xn) * AMPLIFY))
    assert image[32:].max() == 255, "the large error is clipped to white"
    # frame 3's first pixel sits at column 3·W in every row
    np.testing.assert_array_equal(image[0, 3 * 24], as_u8(xn[3, :, 0, 0]))


def test_strip_takes_any_float_dtype_and_clamps():
    x = smooth_clip(2, 8, 8).to(torch.bfloat16)
    y = x.float() * 2 - 0.5  # out of range on both sides
    image = strip(x, y)
    assert image.shape == (24, 16, 3)
    np.testing.assert_array_equal(image[8:16], row(np.clip(y.numpy(), 0, 1)))


@pytest.mark.parametrize(
    ("x_shape", "y_shape", "words"),
    [
        ((4, 3, 8, 8), (4, 3, 8, 9), "differs from the input"),
        ((4, 1, 8, 8), (4, 1, 8, 8), "T×3×H×W"),
        ((1, 4, 3, 8, 8), (1, 4, 3, 8, 8), "T×3×H×W"),
        ((0, 3, 8, 8), (0, 3, 8, 8), "empty clip"),
    ],
)
def test_bad_shapes_raise_a_clear_error(tmp_path, x_shape, y_shape, words):
    x, y = torch.zeros(x_shape), torch.zeros(y_shape)
    with pytest.raises(ValueError, match=words):
        strip(x, y)
    clip = SampleClip(index=0, source="/data/a.mp4", x=x, y=y, psnr=20.0)
    with pytest.raises(ValueError, match=r"sample clip 0 \(/data/a.mp4\)"):
        write_step_samples(tmp_path, 10, [clip])
    assert not (tmp_path / "samples").exists(), "nothing is written when a clip is bad"


def test_write_step_samples_writes_strips_videos_and_index(tmp_path):
    t, h, w = 9, 33, 45  # odd sizes: the video is padded to even
    clips = []
    for k in range(2):
        x = smooth_clip(t, h, w, seed=k)
        y = 1 - x  # far from the input, so the two halves cannot be confused
        clips.append(SampleClip(index=k, source=f"/videos/v{k}.mp4", x=x, y=y, psnr=30.0 + k))
    step_dir, strips = write_step_samples(tmp_path, 120, clips, fps=8)
    assert step_dir == tmp_path / "samples" / "step-120"
    assert len(strips) == 2

    index = json.loads((step_dir / "index.json").read_text())
    assert index["step"] == 120 and index["amplify"] == AMPLIFY
    listed = {index["clips"][k][key] for k in range(2) for key in ("png", "video")}
    assert listed == {p.name for p in step_dir.iterdir()} - {"index.json"}, "every file listed, no others"
    for k, (entry, clip) in enumerate(zip(index["clips"], clips)):
        assert entry["index"] == k and entry["source"] == clip.source and entry["psnr"] == clip.psnr
        assert (entry["frames"], entry["height"], entry["width"]) == (t, h, w)
        assert entry["png"] == f"clip-{k}.png" and entry["video"].startswith(f"clip-{k}.")
        png = np.asarray(Image.open(step_dir / entry["png"]).convert("RGB"))
        np.testing.assert_array_equal(png, strips[k])
        np.testing.assert_array_equal(png, strip(clip.x, clip.y))

        with av.open(str(step_dir / entry["video"])) as container:
            decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        assert decoded.shape == (t, h + 1, 2 * w, 3), "T frames, height padded to even"
        left = decoded[:, :h, :w].astype(np.float32)
        right = decoded[:, :h, w : 2 * w].astype(np.float32)
        want_left = row_frames(clip.x)
        want_right = row_frames(clip.y)
        # yuv420p halves the colour resolution: close, not exact
        assert np.abs(left - want_left).mean() < 8, "left half is the input"
        assert np.abs(right - want_right).mean() < 8, "right half is the reconstruction"
        assert np.abs(left - want_right).mean() > 40
    mtimes = {p.name: p.stat().st_mtime_ns for p in step_dir.iterdir()}
    assert mtimes["index.json"] >= max(mtimes.values())
    assert not [p for p in step_dir.iterdir() if p.name.startswith(".")], "no temporary files left"


def row_frames(frames: torch.Tensor) -> np.ndarray:
    return as_u8(frames.numpy()).transpose(0, 2, 3, 1).astype(np.float32)


def test_side_by_side_pads_to_even_sizes():
    x = smooth_clip(3, 7, 5)
    frames = side_by_side(x, x)
    assert frames.shape == (3, 8, 10, 3)
    assert (frames[:, 7] == 0).all()


def test_index_is_written_last_and_a_failed_rewrite_leaves_no_index(tmp_path):
    clips = [
        SampleClip(k, f"v{k}.mp4", smooth_clip(4, 16, 16, k), smooth_clip(4, 16, 16, k), 100.0)
        for k in range(2)
    ]
    step_dir, _ = write_step_samples(tmp_path, 5, clips)
    assert (step_dir / "index.json").exists()
    # A real failure part-way through a rewrite (clip 1's video cannot replace a folder): the old
    # index.json is gone and no new one is written, so a reader skips this step.
    video = json.loads((step_dir / "index.json").read_text())["clips"][1]["video"]
    (step_dir / video).unlink()
    (step_dir / video).mkdir()
    (step_dir / video / "keep").write_text("x")
    with pytest.raises(OSError):
        write_step_samples(tmp_path, 5, clips)
    assert (step_dir / "clip-0.png").exists()
    assert not (step_dir / "index.json").exists()
