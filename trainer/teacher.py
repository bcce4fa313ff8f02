"""The teacher VAE each family distils from (a local diffusers directory; its class read from
config.json's `_class_name`): loading it with errors a user can act on, checking that its latents
are the family's, its identity for the latent cache, and the frame alignment shared by every path.
Latents are the teacher's raw ones, as in the author's notebook: no latents_mean/std, no scaling."""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.errors import TeacherError
from trainer.families import FAMILIES, teacher_frames
from trainer.teacher_geometry import (
    TEACHER_CLASSES,
    TeacherGeometry,
    check_teacher_family,
    model_dir,
    read_teacher_config,
    teacher_dir,
    teacher_geometry,
)

__all__ = [
    "TEACHER_CLASSES",
    "TeacherError",
    "TeacherGeometry",
    "check_teacher_family",
    "read_teacher_config",
    "teacher_geometry",
]

TEACHER_CLASS = "AutoencoderKLHunyuanVideo"  # taehv's, the default family's
# The pixels each teacher class takes: diffusers' video VAEs take [-1, 1], MiniMax H3's takes
# ImageNet-normalised RGB, (x - mean) / std of [0, 1] frames (its class's docstring in diffusers 0.42)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGENET_PIXELS = ("AutoencoderKLMiniMaxH3",)


def load_teacher(
    path: str | Path,
    subfolder: str = "",
    latent_channels: int = 16,
    where: str = "loss.teacher",
    family: str | None = None,
    space_scale: int | None = None,
    time_scale: int | None = None,
) -> Any:
    """The teacher on the CPU in eval mode, frozen, of the class its config.json names. Raises
    TeacherError for a missing directory, one diffusers cannot load, or latents that are not the
    family's (given `family`; else only the latent channel count is checked)."""
    directory = teacher_dir(path, subfolder, where)
    config = read_teacher_config(path, subfolder, where)
    name = config["_class_name"]
    try:
        geometry = teacher_geometry(config)
    except (KeyError, TypeError, ValueError) as err:
        raise TeacherError(
            f"{where} = {str(directory)!r}: config.json of {name} is malformed: {err!r}"
        ) from None
    if family is not None:
        fam = FAMILIES.get(family)
        check_teacher_family(
            geometry,
            family,
            latent_channels,
            space_scale or (fam.space_scale if fam else 8),
            time_scale or (fam.time_scale if fam else 4),
            f"{where} = {str(directory)!r}",
        )
    elif geometry.latent_channels != latent_channels:
        raise TeacherError(
            f"{where} = {str(directory)!r}: the teacher has {geometry.latent_channels} latent channels, "
            f"the student (model.latent_channels) has {latent_channels}"
        )
    try:
        import diffusers

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            teacher = getattr(diffusers, name).from_pretrained(
                str(Path(path).expanduser()), subfolder=subfolder or None
            )
    except Exception as err:  # noqa: BLE001 - any failure to load is the same user-facing error
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TeacherError(f"{where} = {str(directory)!r}: cannot load {name}: {first}") from None
    return teacher.requires_grad_(False).eval()


def place_teacher(teacher: Any, device: torch.device | str, dtype: torch.dtype) -> Any:
    """The teacher on `device` in `dtype`, but for what its class pins to float32
    (`_keep_in_fp32_modules`, matched by name part as diffusers' from_pretrained(torch_dtype=) does):
    MiniMax H3 pins its encoder, quant_conv and norms, and casts its input to the encoder's dtype
    itself. A plain `.to(dtype)` would put those in bf16 as well."""
    teacher = teacher.to(device=device, dtype=dtype)
    keep = getattr(teacher, "_keep_in_fp32_modules", None) or []
    if isinstance(keep, str):
        keep = [keep]
    if dtype == torch.float32 or not keep:
        return teacher
    for name, tensor in [*teacher.named_parameters(), *teacher.named_buffers()]:
        if torch.is_floating_point(tensor) and any(k in name.split(".") for k in keep):
            tensor.data = tensor.data.float()
    return teacher


def teacher_pixels(teacher: Any, video: torch.Tensor) -> torch.Tensor:
    """A [0, 1] clip N x T x 3 x H x W as the teacher's class takes it: N x 3 x T x H x W in [-1, 1], or
    ImageNet-normalised for MiniMax H3, in the teacher's dtype."""
    x = video.to(teacher.dtype)
    if type(teacher).__name__ in IMAGENET_PIXELS:
        mean = torch.tensor(IMAGENET_MEAN, dtype=x.dtype, device=x.device).view(1, 1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, dtype=x.dtype, device=x.device).view(1, 1, 3, 1, 1)
        x = (x - mean) / std
    else:
        x = x.mul(2).sub(1)
    return x.permute(0, 2, 1, 3, 4)


def teacher_decoded_frames(teacher: Any, sample: torch.Tensor) -> torch.Tensor:
    """The teacher's decode (N x 3 x T x H x W in its pixel convention) as [0, 1] frames N x T x 3 x H x W."""
    x = sample.float()
    if type(teacher).__name__ in IMAGENET_PIXELS:
        mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1, 1)
        x = x * std + mean
    else:
        x = x.add(1).div(2)
    return x.clamp(0, 1).permute(0, 2, 1, 3, 4)


def encode(
    teacher: Any, video: torch.Tensor, family: str = "taehv", time_scale: int | None = None
) -> torch.Tensor:
    """Raw teacher latents (N x k x C x h x w) of a [0, 1] clip N x T x 3 x H x W: the teacher sees the
    family's leading frames (families.teacher_frames: T - 3, LTX T - 7, CogVideoX's even k and H3 all T:
    diffusers' H3 class chunks the clip and drops the last 3 latents itself) in its pixel convention
    (teacher_pixels), the mode of its posterior, unscaled (no latents_mean/std, no scaling_factor).
    time_scale: a `custom` student's."""

    n = teacher_frames(family, video.shape[1], time_scale)
    with torch.no_grad():
        lat = teacher.encode(teacher_pixels(teacher, video[:, :n])).latent_dist.mode()
    return lat.permute(0, 2, 1, 3, 4)


def student_latent_frames(family: str, frames: int, time_scale: int = 4) -> int:
    """How many latents the family's student gives a `frames`-frame clip (a length that fits)."""
    fam = FAMILIES.get(family)
    if fam is not None and fam.chunks is not None:
        c = fam.chunks
        return frames // c.frames * (c.frames + c.lead) // fam.time_scale - c.dropped_latents
    return frames // (fam.time_scale if fam is not None else time_scale)


@dataclass(frozen=True)
class TeacherProbe:
    latent_shape: tuple[int, ...]  # per clip: k x C x h x w
    expected: tuple[int, ...]
    clip: tuple[int, int, int] = (8, 16, 16)  # the test clip: frames, height, width

    @property
    def ok(self) -> bool:
        return self.latent_shape == self.expected


def probe_teacher(
    teacher: Any, latent_channels: int = 16, family: str = "taehv", time_scale: int = 4, space_scale: int = 8
) -> TeacherProbe:
    """Encode one tiny clip (two of the family's frame quanta, two latent cells a side) and compare the
    latent shape with the student's."""
    fam = FAMILIES.get(family)
    t, s = (fam.time_scale, fam.space_scale) if fam else (time_scale, space_scale)
    frames = 2 * (fam.chunks.frames if fam and fam.chunks else t)
    video = torch.rand(1, frames, 3, 2 * s, 2 * s)
    lat = encode(teacher, video, family, t)
    return TeacherProbe(
        tuple(lat.shape[1:]),
        (student_latent_frames(family, frames, t), latent_channels, 2, 2),
        (frames, 2 * s, 2 * s),
    )


def check_teacher(
    path: str,
    subfolder: str = "",
    latent_channels: int = 16,
    family: str | None = None,
    space_scale: int | None = None,
    time_scale: int | None = None,
) -> dict:
    """Load, probe and identify a teacher: what preflight runs on every node, for the run's family (and
    a `custom` student's space and time scales). A JSON-ready dict, {"ok": True, "latent_shape": ...,
    "clip": [frames, h, w], "identity": ...} or {"ok": False, "error": ...}."""
    try:
        teacher = load_teacher(
            path, subfolder, latent_channels, family=family, space_scale=space_scale, time_scale=time_scale
        )
        probe = probe_teacher(teacher, latent_channels, family or "taehv", time_scale or 4, space_scale or 8)
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
            "error": f"loss.teacher = {str(path)!r}: a test clip gives latents "
            f"{'x'.join(map(str, probe.latent_shape))}, the student needs "
            f"{'x'.join(map(str, probe.expected))} (latents x C x h x w)",
        }
    return {
        "ok": True,
        "path": str(path),
        "latent_shape": list(probe.latent_shape),
        "clip": list(probe.clip),
        "identity": teacher_identity(path, subfolder),
    }


def teacher_identity(path: str | Path, subfolder: str = "") -> dict:
    """What a latent cache records of the teacher it came from: the config's hash and each weight
    file's size and mtime (hashing gigabytes of weights on every start would cost more than it buys)."""
    directory = model_dir(path, subfolder)
    config = directory / "config.json"
    weights = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin"))
    try:
        name = json.loads(config.read_text()).get("_class_name", TEACHER_CLASS)
    except ValueError:
        name = TEACHER_CLASS
    return {
        "class": name,
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest(),
        "weights": [
            {"name": p.name, "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns} for p in weights
        ],
    }
