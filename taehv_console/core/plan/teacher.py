"""Distillation's cost: step time and GPU-hours with the teacher VAE online against cached latents,
and how a plan shows them (plain values and text)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainer.config import TrainConfig
from trainer.families import DEFAULT_FAMILY, teacher_frames
from trainer.flops import REFERENCE_CLIP, ModelLike, architecture, flop_per_clip_step


@dataclass(frozen=True)
class TeacherEncode:
    """One family's teacher VAE and what its encode costs: `tflop` counted for one clip of `clip`
    (frames the teacher encodes, height, width) by torch's FlopCounterMode over
    `<teacher_class>(**overrides).encode(x).latent_dist.mode()` on the meta device (diffusers 0.42.1,
    the class's own tiling settings, as trainer/teacher.py loads it; tests/core/plan/test_family_costs.py
    counts them again). Other clip sizes scale by the voxels the teacher encodes: an estimate, since
    not every cost is linear in them. Counted at other sizes: HunyuanVideo encodes more than 16 frames
    in overlapping 16-frame windows (17 x 480 x 720: 1.29x the voxel-scaled figure); H3 tiles its
    input in 256-pixel tiles with 64 of overlap by default (17 x 256 x 352: 0.64x); the rest stay
    within 5 % from 9 to 25 frames."""

    teacher_class: str
    config: str  # which published config the constructor arguments are, and where they come from
    tflop: float
    clip: tuple[int, int, int]
    estimate: str = ""  # why the figure is an estimate beyond the voxel scaling, when it is one
    overrides: tuple[tuple[str, object], ...] = ()  # constructor arguments besides the class defaults

    @property
    def flop_per_voxel(self) -> float:
        f, h, w = self.clip
        return self.tflop * 1e12 / (f * h * w)


# Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json (as diffusers' conversion script writes it): the
# class defaults are Wan 2.1's VAE
WAN22_CONFIG: tuple[tuple[str, object], ...] = (
    ("base_dim", 160),
    ("decoder_base_dim", 256),
    ("z_dim", 48),
    ("in_channels", 12),
    ("out_channels", 12),
    ("is_residual", True),
    ("patch_size", 2),
    ("scale_factor_spatial", 16),
)
_HV1 = TeacherEncode(
    "AutoencoderKLHunyuanVideo", "class defaults = HunyuanVideo's VAE (FACTS: 29.9)", 29.854, (9, 480, 720)
)
_WAN21 = TeacherEncode("AutoencoderKLWan", "class defaults = Wan 2.1's VAE (z_dim 16)", 16.267, (9, 480, 720))
_WAN22 = TeacherEncode(
    "AutoencoderKLWan",
    "Wan2.2-TI2V-5B's vae/config.json (WAN22_CONFIG)",
    11.270,
    (9, 480, 720),
    overrides=WAN22_CONFIG,
)
# The next three: the class defaults, taken to be the published VAE's config (diffusers writes each
# class's defaults from the model it was added for; no config file is here to compare with)
_HV15 = TeacherEncode(
    "AutoencoderKLHunyuanVideo15", "class defaults (latent 32, spatial 16, temporal 4)", 44.783, (9, 480, 720)
)
# 9 frames = a 16-frame student clip (1 + 8k frames); 704 = 22 x 32 (the family's crops are multiples of 32)
_LTX2 = TeacherEncode(
    "AutoencoderKLLTX2Video", "class defaults (patch 4, latent 128, 8x time)", 9.873, (9, 480, 704)
)
# the chunked teacher encodes every frame: a 17-frame chunk behind 3 zero frames, tiled in space
_H3 = TeacherEncode(
    "AutoencoderKLMiniMaxH3", "class defaults (clip_length 17, token_drop 3)", 107.459, (17, 480, 720)
)
TEACHER_ENCODE: dict[str, TeacherEncode] = {
    "taehv": _HV1,
    "taew2_1": _WAN21,
    "taew2_2": _WAN22,
    "taew2_2_super": _WAN22,
    "taehv1_5": _HV15,
    "taehv1_5_super": _HV15,
    "taecvx": TeacherEncode(
        "AutoencoderKLCogVideoX", "class defaults = CogVideoX's VAE (sample 480x720)", 28.809, (9, 480, 720)
    ),
    "taeltx_2": _LTX2,
    "taeltx2_3": TeacherEncode(
        _LTX2.teacher_class,
        _LTX2.config,
        _LTX2.tflop,
        _LTX2.clip,
        estimate="LTX-2.3's VAE config is not here to count: LTX-2's (the class defaults) assumed",
    ),
    "taeh3": _H3,
}


def teacher_encode(model: ModelLike) -> tuple[TeacherEncode, str]:
    """The teacher of a family (by name or a run's `[model]`) and a note when it is assumed: a
    `custom` model's teacher is unknown, taehv's (HunyuanVideo) is assumed."""
    name = model if isinstance(model, str) else getattr(model, "family", DEFAULT_FAMILY)
    if name in TEACHER_ENCODE:
        t = TEACHER_ENCODE[name]
        return t, (f"an estimate: {t.estimate}" if t.estimate else "")
    return TEACHER_ENCODE[DEFAULT_FAMILY], f"{name}: no family's teacher; taehv's (HunyuanVideo) assumed"


def teacher_encode_flop(model: ModelLike, frames: int, height: int, width: int) -> float:
    """The teacher's encode of one student clip of frames x height x width: the leading frames it sees
    (families.teacher_frames: T - 3, LTX T - 7, H3 and CogVideoX at an even latent count all T) at its
    counted FLOPs per voxel."""
    t, _ = teacher_encode(model)
    name = model if isinstance(model, str) else getattr(model, "family", DEFAULT_FAMILY)
    seen = teacher_frames(name, frames, 2 ** sum(architecture(model).encoder_time_downscale))
    return t.flop_per_voxel * seen * height * width


# taehv's figures at the reference clip, 12x480x720 (the planner's own are its config's family's, at
# its clip): the teacher's encode of 9 frames, the student's step, the decoder's extra pass on the
# teacher's latents (forward and backward, no input gradient for the latents)
TEACHER_ENCODE_TFLOP = round(teacher_encode_flop(DEFAULT_FAMILY, *REFERENCE_CLIP) / 1e12, 2)
STUDENT_STEP_TFLOP = round(flop_per_clip_step(*REFERENCE_CLIP) / 1e12, 2)
DECODER_STEP_TFLOP = round(
    (flop_per_clip_step(*REFERENCE_CLIP, teacher_decode=True) - flop_per_clip_step(*REFERENCE_CLIP)) / 1e12, 2
)
CACHE_BUILD_WINDOWS = 100_000  # the cache's one-off cost is quoted per this many clip windows


@dataclass(frozen=True)
class TeacherCost:
    """Distillation's cost, the teacher run online beside the cached latents. `mode` is what the config
    runs ("online", "cached", or "off" when it does not distil: then the figures say what it would cost)."""

    mode: str
    encode_ratio: float  # teacher encode per clip, in student steps (taehv at 12x480x720: 29.9 / 5.73)
    decoder_ratio: float  # the decoder's extra pass on teacher latents, in student steps
    online_step_s: float
    cached_step_s: float
    online_hours: float
    cached_hours: float
    online_gpu_hours: float
    cached_gpu_hours: float
    cache_build_gpu_hours: float  # one-off: encoding CACHE_BUILD_WINDOWS clip windows
    family: str = DEFAULT_FAMILY
    teacher_class: str = _HV1.teacher_class
    encode_tflop: float = TEACHER_ENCODE_TFLOP  # per clip of the config's size
    student_step_tflop: float = STUDENT_STEP_TFLOP  # per clip of the config's size
    note: str = ""  # where the teacher's figure is an estimate


def teacher_cost(
    cfg: TrainConfig, compute_s: float, comm_s: float, clips_per_s_per_gpu: float
) -> TeacherCost:
    """Step time and GPU-hours with the teacher online and with cached latents, from the student's
    compute time per step (student-only) and the communication per step (unchanged by the teacher)."""
    loss = cfg.loss
    mode = "cached" if loss.teacher_cache else ("online" if loss.teacher else "off")
    d, m = cfg.data, cfg.model
    clip = (d.frames, d.height, d.width)
    student = flop_per_clip_step(*clip, model=m)
    teacher_flop = teacher_encode_flop(m, *clip)
    encode = teacher_flop / student
    # the GPU presets train the decoder on the teacher's latents (the author's recipe); a what-if for a
    # config that does not distil assumes the same
    decoder = (
        (flop_per_clip_step(*clip, teacher_decode=True, model=m) - student) / student
        if (loss.decoder_on_teacher_latents or mode == "off")
        else 0.0
    )
    online = compute_s * (1 + decoder + encode) + comm_s
    cached = compute_s * (1 + decoder) + comm_s
    steps, world = cfg.optim.max_steps, cfg.topology.world_size
    return TeacherCost(
        mode=mode,
        encode_ratio=encode,
        decoder_ratio=decoder,
        online_step_s=online,
        cached_step_s=cached,
        online_hours=online * steps / 3600,
        cached_hours=cached * steps / 3600,
        online_gpu_hours=online * steps * world / 3600,
        cached_gpu_hours=cached * steps * world / 3600,
        cache_build_gpu_hours=CACHE_BUILD_WINDOWS * encode / clips_per_s_per_gpu / 3600,
        family=m.family,
        teacher_class=teacher_encode(m)[0].teacher_class,
        encode_tflop=teacher_flop / 1e12,
        student_step_tflop=student / 1e12,
        note=teacher_encode(m)[1],
    )


def teacher_to_dict(t: TeacherCost) -> dict:
    return {
        "mode": t.mode,
        "family": t.family,
        "teacher_class": t.teacher_class,
        "encode_tflop_per_clip": t.encode_tflop,
        "student_step_tflop_per_clip": t.student_step_tflop,
        "note": t.note,
        "encode_ratio_to_student_step": t.encode_ratio,
        "decoder_ratio_to_student_step": t.decoder_ratio,
        "online": {
            "step_s": t.online_step_s,
            "hours_to_max_steps": t.online_hours,
            "gpu_hours": t.online_gpu_hours,
        },
        "cached": {
            "step_s": t.cached_step_s,
            "hours_to_max_steps": t.cached_hours,
            "gpu_hours": t.cached_gpu_hours,
            "build_gpu_hours_per_windows": t.cache_build_gpu_hours,
            "build_windows": CACHE_BUILD_WINDOWS,
        },
    }


def teacher_lines(t: TeacherCost, hours: Callable[[float], str]) -> list[str]:
    """The side-by-side text a plan prints (CLI and wizard): online teacher against cached latents.
    `hours` formats a number of hours."""
    head = {
        "online": "distilling, teacher online",
        "cached": "distilling from cached latents",
        "off": "not distilling; with --set loss.teacher=DIR it would cost",
    }[t.mode]
    return [
        f"{head}:",
        (
            f"  teacher online  {t.online_step_s:.3g} s/step, {hours(t.online_hours)}, "
            f"{t.online_gpu_hours:,.0f} GPU-hours ({t.family}'s teacher {t.teacher_class}: encode "
            f"{t.encode_tflop:.3g} TFLOP per clip = {t.encode_ratio:.1f}x a student step of "
            f"{t.student_step_tflop:.3g})"
        ),
        (
            f"  cached latents  {t.cached_step_s:.3g} s/step, {hours(t.cached_hours)}, "
            f"{t.cached_gpu_hours:,.0f} GPU-hours + {t.cache_build_gpu_hours:,.0f} GPU-hours once per "
            f"{CACHE_BUILD_WINDOWS:,} clip windows (cache-latents)"
        ),
    ] + ([f"  ({t.note})"] if t.note else [])
