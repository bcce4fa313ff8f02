"""What a teacher VAE's config.json says of its latents, without torch: the diffusers class (its
`_class_name`), latent channels and pixels per latent in space and time, which published family it
serves, and the student `model.family = auto` derives from it. trainer/teacher.py loads the teacher;
the config schema (trainer/config.py) resolves `auto` with this module at config load, so the console
reads it without loading torch (diffusers is imported only to fill keys a config.json leaves out).

The compression is computed from the keys that build the encoder, as each class builds it in diffusers
0.42, not from informational keys a pipeline reads: AutoencoderKLWan's `scale_factor_spatial` is not
used by its encoder (dim_mult, temperal_downsample and patch_size are), and AutoencoderKLLTX2Video's
default `spatial_compression_ratio` (None: patch_size · 2^sum(spatio_temporal_scaling) = 64) is not
what its 'spatial'/'temporal'/'spatiotemporal' downsamplers give (32 and 8).
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.errors import TeacherError
from trainer.families import CUSTOM, FAMILIES

# The diffusers VAE classes a teacher may be (the families' teacher classes): all in diffusers 0.42.
TEACHER_CLASSES = tuple(dict.fromkeys(f.teacher_class for f in FAMILIES.values()))
AUTO = "auto"  # model.family: derive the student from loss.teacher's config
# The time scales a student's three encoder stages can give (two or three stride-2 TPools)
AUTO_TIME = {4: ((True, True, False), (False, True, True)), 8: ((True, True, True), (True, True, True))}
MAX_PATCH = 8  # model.patch_size's bound


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


def model_dir(path: str | Path, subfolder: str = "") -> Path:
    return Path(path).expanduser() / subfolder if subfolder else Path(path).expanduser()


def teacher_dir(path: str | Path, subfolder: str, where: str) -> Path:
    """The directory holding the teacher's config.json; TeacherError naming `where` when there is none."""
    if not str(path).strip():
        raise TeacherError(
            f"{where} is empty: set it to a local diffusers VAE directory ({', '.join(TEACHER_CLASSES)})"
        )
    root = Path(path).expanduser()
    if not root.is_dir():
        raise TeacherError(f"{where} = {str(root)!r}: no such directory (a teacher is never substituted)")
    out = model_dir(root, subfolder)
    if not (out / "config.json").is_file():
        raise TeacherError(
            f"{where} = {str(out)!r}: no config.json (not a diffusers model directory; "
            f"save one with the VAE class's save_pretrained, or set loss.teacher_subfolder)"
        )
    return out


# the keys teacher_geometry reads, per class: a config.json that has them all needs no diffusers
_GEOMETRY_KEYS = {
    "AutoencoderKLHunyuanVideo": (
        "latent_channels",
        "spatial_compression_ratio",
        "temporal_compression_ratio",
    ),
    "AutoencoderKLHunyuanVideo15": (
        "latent_channels",
        "spatial_compression_ratio",
        "temporal_compression_ratio",
    ),
    "AutoencoderKLWan": ("z_dim", "dim_mult", "temperal_downsample", "patch_size"),
    "AutoencoderKLCogVideoX": ("latent_channels", "block_out_channels", "temporal_compression_ratio"),
    "AutoencoderKLLTX2Video": (
        "latent_channels",
        "spatio_temporal_scaling",
        "downsample_type",
        "layers_per_block",
        "patch_size",
        "patch_size_t",
    ),
    "AutoencoderKLMiniMaxH3": (
        "latent_channels",
        "spatial_downsample_factors",
        "temporal_downsample_factors",
    ),
}


def read_teacher_config(path: str | Path, subfolder: str = "", where: str = "loss.teacher") -> dict:
    """The teacher directory's config.json, with the class's defaults under what it leaves out (a
    config written by save_pretrained has every key; only an incomplete one imports diffusers)."""
    directory = teacher_dir(path, subfolder, where)
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise TeacherError(f"{where} = {str(directory)!r}: config.json cannot be read: {err}") from None
    name = config.get("_class_name") if isinstance(config, dict) else None
    if name not in TEACHER_CLASSES:
        raise TeacherError(
            f"{where} = {str(directory)!r}: config.json's _class_name is {name!r}, not a video VAE a "
            f"family distils from ({', '.join(TEACHER_CLASSES)})"
        )
    if all(k in config for k in _GEOMETRY_KEYS[name]):
        return config
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


def _log2(value: Any) -> int:
    return int(math.log2(int(value))) if int(value) > 0 else 0


def teacher_geometry(config: dict) -> TeacherGeometry:
    """Latent channels and compression of a teacher, from its (default-filled) config, as the class's
    encoder is built from it."""
    name = config["_class_name"]
    if name == "AutoencoderKLWan":
        # len(dim_mult) - 1 stride-2 stages (temperal_downsample says which also halve time), after
        # a patch_size x patch_size patchify (Wan 2.2)
        levels = len(config["dim_mult"]) - 1
        patch = int(config.get("patch_size") or 1)
        time = 2 ** sum(bool(t) for t in list(config["temperal_downsample"])[:levels])
        return TeacherGeometry(name, int(config["z_dim"]), 2**levels * patch, time)
    if name == "AutoencoderKLCogVideoX":
        # every block but the last halves space; the first log2(ratio) of those halve time too
        levels = len(config["block_out_channels"]) - 1
        time = 2 ** min(_log2(config["temporal_compression_ratio"]), levels)
        return TeacherGeometry(name, int(config["latent_channels"]), 2**levels, time)
    if name == "AutoencoderKLLTX2Video":
        blocks = len(config["layers_per_block"]) - 1  # the last entry is the mid block's
        scaling = config["spatio_temporal_scaling"]
        scaling = [scaling] * blocks if isinstance(scaling, bool) else list(scaling)
        kinds = [k for k, on in zip(config["downsample_type"], scaling) if on]
        space = sum(k in ("conv", "spatial", "spatiotemporal") for k in kinds)
        time = sum(k in ("conv", "temporal", "spatiotemporal") for k in kinds)
        return TeacherGeometry(
            name,
            int(config["latent_channels"]),
            int(config["patch_size"]) * 2**space,
            int(config["patch_size_t"]) * 2**time,
        )
    if name == "AutoencoderKLMiniMaxH3":
        return TeacherGeometry(
            name,
            int(config["latent_channels"]),
            math.prod(int(v) for v in config["spatial_downsample_factors"]),
            math.prod(int(v) for v in config["temporal_downsample_factors"]),
        )
    # HunyuanVideo 1 and 1.5 build their down blocks from these two ratios
    return TeacherGeometry(
        name,
        int(config["latent_channels"]),
        int(config["spatial_compression_ratio"]),
        int(config["temporal_compression_ratio"]),
    )


def geometry_of(path: str | Path, subfolder: str = "", where: str = "loss.teacher") -> TeacherGeometry:
    """The geometry of the teacher at `path`; TeacherError naming `where` for a config it cannot read."""
    config = read_teacher_config(path, subfolder, where)
    try:
        return teacher_geometry(config)
    except (KeyError, TypeError, ValueError) as err:
        raise TeacherError(
            f"{where} = {str(model_dir(path, subfolder))!r}: config.json of {config['_class_name']} is "
            f"malformed: {err!r}"
        ) from None


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
    if fits:
        hint = f"; it fits model.family = {' or '.join(fits)}"
    elif auto_problem(geometry) is None:
        hint = "; no published family fits it (model.family = auto derives a student from it)"
    else:
        hint = f"; no family fits it, and model.family = auto cannot serve it: {auto_problem(geometry)}"
    want = f"{own.teacher_class}, " if own is not None else ""
    raise TeacherError(
        f"{where}: the teacher is {geometry}; model.family = {family} needs {want}{latent_channels} latent "
        f"channels, {space_scale}x space, {time_scale}x time{hint}"
    )


def auto_problem(geometry: TeacherGeometry) -> str | None:
    """None when `model.family = auto` can derive a student from this teacher; else why not."""
    if geometry.families():
        return None
    s, t = geometry.space_scale, geometry.time_scale
    problems = []
    if s % 8 or not 8 <= s <= 8 * MAX_PATCH:
        problems.append(f"{s}x space is not 8·p for a patch p of 1 to {MAX_PATCH}")
    if t not in AUTO_TIME:
        problems.append(f"{t}x time is neither 4x nor 8x (the student's encoder has three 1x/2x stages)")
    if geometry.class_name == "AutoencoderKLMiniMaxH3":
        problems.append(
            "H3's chunked encoder (17-frame chunks, 3 latents dropped) has a student only as taeh3"
        )
    return "; ".join(problems) or None


def auto_model(geometry: TeacherGeometry) -> dict[str, object]:
    """The `[model]` shape keys `model.family = auto` resolves to for this teacher: the published
    family whose class and shapes are the teacher's (the first in table order with the base decoder:
    LTX-2 and LTX-2.3 share a VAE geometry, so an LTX-2 VAE names taeltx_2), else `custom` with its
    latent channels, patch = space / 8 and the strides of its time scale. TeacherError otherwise."""
    fits = [f for f in geometry.families() if not FAMILIES[f].super_decoder]
    if fits:
        return {"family": fits[0], **FAMILIES[fits[0]].shape_knobs()}
    problem = auto_problem(geometry)
    if problem is not None:
        raise TeacherError(f"model.family = auto: the teacher is {geometry}; no student serves it: {problem}")
    enc, dec = AUTO_TIME[geometry.time_scale]
    return {
        "family": CUSTOM,
        "latent_channels": geometry.latent_channels,
        "patch_size": geometry.space_scale // 8,
        "encoder_time_downscale": enc,
        "decoder_time_upscale": dec,
    }
