"""The teacher VAE each family distils from (a local diffusers directory; its class read from
config.json's `_class_name`): loading it with errors a user can act on, checking that its latents
are the family's, its identity for the latent cache, and the frame alignment shared by every path.
Latents are the teacher's raw ones, as in the author's notebook: no latents_mean/std, no scaling."""

from __future__ import annotations

import hashlib
import inspect
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.errors import TeacherError
from trainer.families import FAMILIES, teacher_frames

# The diffusers VAE classes a teacher may be (the families' teacher classes): all in diffusers 0.42.
TEACHER_CLASSES = tuple(dict.fromkeys(f.teacher_class for f in FAMILIES.values()))
TEACHER_CLASS = "AutoencoderKLHunyuanVideo"  # taehv's, the default family's


@dataclass(frozen=True)
class TeacherGeometry:
    """What a teacher's config says of its latents: channels, and pixels per latent in space and time."""

    class_name: str
    latent_channels: int
    space_scale: int
    time_scale: int

    def families(self) -> list[str]:
        """The published families whose student this teacher fits (its class and its shapes)."""
        return [
            f.name
            for f in FAMILIES.values()
            if (f.teacher_class, f.latent_channels, f.space_scale, f.time_scale)
            == (self.class_name, self.latent_channels, self.space_scale, self.time_scale)
        ]

    def __str__(self) -> str:
        return (
            f"{self.class_name} with {self.latent_channels} latent channels, {self.space_scale}x space, "
            f"{self.time_scale}x time"
        )


def _model_dir(path: str | Path, subfolder: str = "") -> Path:
    return Path(path).expanduser() / subfolder if subfolder else Path(path).expanduser()


def _teacher_dir(path: str | Path, subfolder: str, where: str) -> Path:
    if not str(path).strip():
        raise TeacherError(
            f"{where} is empty: set it to a local diffusers VAE directory ({', '.join(TEACHER_CLASSES)})"
        )
    root = Path(path).expanduser()
    if not root.is_dir():
        raise TeacherError(f"{where} = {str(root)!r}: no such directory (a teacher is never substituted)")
    model_dir = _model_dir(root, subfolder)
    if not (model_dir / "config.json").is_file():
        raise TeacherError(
            f"{where} = {str(model_dir)!r}: no config.json (not a diffusers model directory; "
            f"save one with the VAE class's save_pretrained, or set loss.teacher_subfolder)"
        )
    return model_dir


def read_teacher_config(path: str | Path, subfolder: str = "", where: str = "loss.teacher") -> dict:
    """The teacher directory's config.json, with the class's defaults under what it leaves out."""
    model_dir = _teacher_dir(path, subfolder, where)
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise TeacherError(f"{where} = {str(model_dir)!r}: config.json cannot be read: {err}") from None
    name = config.get("_class_name") if isinstance(config, dict) else None
    if name not in TEACHER_CLASSES:
        raise TeacherError(
            f"{where} = {str(model_dir)!r}: config.json's _class_name is {name!r}, not a video VAE a "
            f"family distils from ({', '.join(TEACHER_CLASSES)})"
        )
    import diffusers

    cls = getattr(diffusers, name, None)
    if cls is None:
        raise TeacherError(f"{where}: diffusers {diffusers.__version__} has no {name}")
    defaults = {
        k: p.default
        for k, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    return {**defaults, **config}


def _prod(values: Any) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def teacher_geometry(config: dict) -> TeacherGeometry:
    """Latent channels and compression of a teacher, from its (default-filled) config."""
    name = config["_class_name"]
    if name == "AutoencoderKLWan":
        return TeacherGeometry(
            name,
            int(config["z_dim"]),
            int(config["scale_factor_spatial"]),
            int(config["scale_factor_temporal"]),
        )
    if name == "AutoencoderKLCogVideoX":
        space = 2 ** (len(config["block_out_channels"]) - 1)
        return TeacherGeometry(
            name, int(config["latent_channels"]), space, int(config["temporal_compression_ratio"])
        )
    if name == "AutoencoderKLLTX2Video":
        levels = 2 ** sum(config["spatio_temporal_scaling"])
        space = config["spatial_compression_ratio"] or config["patch_size"] * levels
        time = config["temporal_compression_ratio"] or config["patch_size_t"] * levels
        return TeacherGeometry(name, int(config["latent_channels"]), int(space), int(time))
    if name == "AutoencoderKLMiniMaxH3":
        space, time = (
            _prod(config["spatial_downsample_factors"]),
            _prod(config["temporal_downsample_factors"]),
        )
        return TeacherGeometry(name, int(config["latent_channels"]), space, time)
    return TeacherGeometry(
        name,
        int(config["latent_channels"]),
        int(config["spatial_compression_ratio"]),
        int(config["temporal_compression_ratio"]),
    )


def check_teacher_family(
    geometry: TeacherGeometry,
    family: str,
    latent_channels: int,
    space_scale: int,
    time_scale: int,
    where: str = "loss.teacher",
) -> None:
    """TeacherError when the teacher's latents are not the run family's, naming the family that fits
    it. A published family also wants its own teacher class (taehv, taew2_1 and taecvx share shapes
    but not conventions); `custom` shapes want only matching latents."""
    own = FAMILIES.get(family)
    shapes_ok = (geometry.latent_channels, geometry.space_scale, geometry.time_scale) == (
        latent_channels,
        space_scale,
        time_scale,
    )
    if shapes_ok and (own is None or own.teacher_class == geometry.class_name):
        return
    fits = geometry.families()
    hint = (
        f"; it fits model.family = {' or '.join(fits)}"
        if fits
        else "; no published family fits it (model.family = auto derives a student from it)"
    )
    want = f"{own.teacher_class}, " if own is not None else ""
    raise TeacherError(
        f"{where}: the teacher is {geometry}; model.family = {family} needs {want}{latent_channels} latent "
        f"channels, {space_scale}x space, {time_scale}x time{hint}"
    )


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
    model_dir = _teacher_dir(path, subfolder, where)
    config = read_teacher_config(path, subfolder, where)
    name = config["_class_name"]
    try:
        geometry = teacher_geometry(config)
    except (KeyError, TypeError, ValueError) as err:
        raise TeacherError(
            f"{where} = {str(model_dir)!r}: config.json of {name} is malformed: {err!r}"
        ) from None
    if family is not None:
        fam = FAMILIES.get(family)
        check_teacher_family(
            geometry,
            family,
            latent_channels,
            space_scale or (fam.space_scale if fam else 8),
            time_scale or (fam.time_scale if fam else 4),
            f"{where} = {str(model_dir)!r}",
        )
    elif geometry.latent_channels != latent_channels:
        raise TeacherError(
            f"{where} = {str(model_dir)!r}: the teacher has {geometry.latent_channels} latent channels, "
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
        raise TeacherError(f"{where} = {str(model_dir)!r}: cannot load {name}: {first}") from None
    return teacher.requires_grad_(False).eval()


def encode(
    teacher: Any, video: torch.Tensor, family: str = "taehv", time_scale: int | None = None
) -> torch.Tensor:
    """Raw teacher latents (N x k x C x h x w) of a [0, 1] clip N x T x 3 x H x W: the teacher sees the
    family's leading frames (families.teacher_frames: T - 3, LTX T - 7, H3 all T) in [-1, 1], the mode
    of its posterior, unscaled. time_scale: a `custom` student's."""

    n = teacher_frames(family, video.shape[1], time_scale)
    with torch.no_grad():
        frames = video[:, :n].to(teacher.dtype).mul(2).sub(1).permute(0, 2, 1, 3, 4)
        lat = teacher.encode(frames).latent_dist.mode()
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
        tuple(lat.shape[1:]), (student_latent_frames(family, frames, t), latent_channels, 2, 2)
    )


def check_teacher(
    path: str, subfolder: str = "", latent_channels: int = 16, family: str | None = None
) -> dict:
    """Load, probe and identify a teacher: what preflight runs on every node. A JSON-ready dict,
    {"ok": True, "latent_shape": ..., "identity": ...} or {"ok": False, "error": ...}."""
    try:
        teacher = load_teacher(path, subfolder, latent_channels, family=family)
        probe = probe_teacher(teacher, latent_channels, family or "taehv")
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
        "identity": teacher_identity(path, subfolder),
    }


def teacher_identity(path: str | Path, subfolder: str = "") -> dict:
    """What a latent cache records of the teacher it came from: the config's hash and each weight
    file's size and mtime (hashing gigabytes of weights on every start would cost more than it buys)."""
    model_dir = _model_dir(path, subfolder)
    config = model_dir / "config.json"
    weights = sorted(p for p in model_dir.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin"))
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
