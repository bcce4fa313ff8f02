"""The teacher VAE of the author's recipe (diffusers `AutoencoderKLHunyuanVideo`, raw latents, no
scaling): loading it with errors a user can act on, checking that it yields the student's latent
shape, its identity for the latent cache, and the frame alignment shared by every path."""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.errors import TeacherError

# HunyuanVideo's causal convention: latent 0 is frame 0 alone, latent j >= 1 is frames 4j-3..4j.
# For a T = 4k clip the student's k latents line up with the teacher's encode of frames [0, T-3).
TEACHER_CLASS = "AutoencoderKLHunyuanVideo"


def teacher_frames(frames: int, t_upscale: int = 4) -> int:
    """How many leading frames of a `frames`-frame clip the teacher encodes (T - 3 for T = 4k)."""
    return frames - (t_upscale - 1)


def _model_dir(path: str | Path, subfolder: str = "") -> Path:
    return Path(path).expanduser() / subfolder if subfolder else Path(path).expanduser()


def load_teacher(
    path: str | Path, subfolder: str = "", latent_channels: int = 16, where: str = "loss.teacher"
) -> Any:
    """The teacher on the CPU in eval mode, frozen. Raises TeacherError for a missing directory, one
    diffusers cannot load (corrupt or not a HunyuanVideo VAE), or the wrong latent channel count."""
    root = Path(path).expanduser()
    if not str(path).strip():
        raise TeacherError(f"{where} is empty: set it to a local {TEACHER_CLASS} directory")
    if not root.is_dir():
        raise TeacherError(f"{where} = {str(root)!r}: no such directory (a teacher is never substituted)")
    model_dir = _model_dir(root, subfolder)
    if not (model_dir / "config.json").is_file():
        raise TeacherError(
            f"{where} = {str(model_dir)!r}: no config.json (not a diffusers model directory; "
            f"save one with {TEACHER_CLASS}.save_pretrained, or set loss.teacher_subfolder)"
        )

    try:
        from diffusers import AutoencoderKLHunyuanVideo

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            teacher = AutoencoderKLHunyuanVideo.from_pretrained(str(root), subfolder=subfolder or None)
    except Exception as err:  # noqa: BLE001 - any failure to load is the same user-facing error
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TeacherError(f"{where} = {str(model_dir)!r}: cannot load {TEACHER_CLASS}: {first}") from None
    lc = teacher.config.latent_channels
    if lc != latent_channels:
        raise TeacherError(
            f"{where} = {str(model_dir)!r}: the teacher has {lc} latent channels, the student "
            f"(model.latent_channels) has {latent_channels}"
        )
    return teacher.requires_grad_(False).eval()


def encode(teacher: Any, video: torch.Tensor, t_upscale: int = 4) -> torch.Tensor:
    """Raw teacher latents (N x k x C x H/8 x W/8) of a [0, 1] clip N x T x 3 x H x W: the teacher
    sees frames [0, T-3) in [-1, 1], the mode of its posterior, no scaling factor."""

    n = teacher_frames(video.shape[1], t_upscale)
    with torch.no_grad():
        frames = video[:, :n].to(teacher.dtype).mul(2).sub(1).permute(0, 2, 1, 3, 4)
        lat = teacher.encode(frames).latent_dist.mode()
    return lat.permute(0, 2, 1, 3, 4)


@dataclass(frozen=True)
class TeacherProbe:
    latent_shape: tuple[int, ...]  # per clip: k x C x h x w
    expected: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return self.latent_shape == self.expected


def probe_teacher(teacher: Any, latent_channels: int = 16, frames: int = 8, size: int = 16) -> TeacherProbe:
    """Encode one tiny clip and compare the latent shape with the student's (T/4 x C x H/8 x W/8)."""

    video = torch.rand(1, frames, 3, size, size)
    lat = encode(teacher, video)
    return TeacherProbe(tuple(lat.shape[1:]), (frames // 4, latent_channels, size // 8, size // 8))


def check_teacher(path: str, subfolder: str = "", latent_channels: int = 16) -> dict:
    """Load, probe and identify a teacher: what preflight runs on every node. A JSON-ready dict,
    {"ok": True, "latent_shape": ..., "identity": ...} or {"ok": False, "error": ...}."""
    try:
        teacher = load_teacher(path, subfolder, latent_channels)
        probe = probe_teacher(teacher, latent_channels)
    except TeacherError as err:
        return {"ok": False, "path": str(path), "error": str(err)}
    except Exception as err:  # noqa: BLE001 - a teacher that loads but cannot encode is as unusable
        return {
            "ok": False,
            "path": str(path),
            "error": f"loss.teacher = {str(path)!r}: encoding a test clip "
            f"failed: {type(err).__name__}: {err}",
        }
    if not probe.ok:
        return {
            "ok": False,
            "path": str(path),
            "latent_shape": list(probe.latent_shape),
            "error": f"loss.teacher = {str(path)!r}: an 8-frame 16x16 clip gives latents "
            f"{'x'.join(map(str, probe.latent_shape))}, the student needs "
            f"{'x'.join(map(str, probe.expected))} (T/4 x C x H/8 x W/8)",
        }
    return {
        "ok": True,
        "path": str(path),
        "latent_shape": list(probe.latent_shape),
        "identity": teacher_identity(path, subfolder),
    }


def teacher_identity(path: str | Path, subfolder: str = "") -> dict:
    """What a latent cache records of the teacher it came from: the config's hash and each weight
    file's size and mtime (hashing gigabytes of weights on every start would cost more than it buys)."""
    model_dir = _model_dir(path, subfolder)
    config = model_dir / "config.json"
    weights = sorted(p for p in model_dir.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin"))
    return {
        "class": TEACHER_CLASS,
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
        "weights": [
            {"name": p.name, "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns} for p in weights
        ],
    }
