"""Distillation's cost: step time and GPU-hours with the teacher VAE online against cached latents,
and how a plan shows them (plain values and text)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainer.config import TrainConfig

# The author's recipe (FACTS): the teacher (HunyuanVideo's VAE) encodes each clip, 29.9 TFLOP at
# 12x480x720, against 6.1 TFLOP for a whole training step of the student (forward 0.628 encoder +
# 1.413 decoder, backward twice that). Training the decoder on the teacher's latents as well adds a
# decoder forward and backward: 3 x 1.413 TFLOP. All scale with frames x height x width, so the
# ratios hold at any clip size; the teacher is assumed to run at the student's share of peak.
TEACHER_ENCODE_TFLOP = 29.9
STUDENT_STEP_TFLOP = 6.1
DECODER_STEP_TFLOP = 3 * 1.413
CACHE_BUILD_WINDOWS = 100_000  # the cache's one-off cost is quoted per this many clip windows


@dataclass(frozen=True)
class TeacherCost:
    """Distillation's cost, the teacher run online beside the cached latents. `mode` is what the config
    runs ("online", "cached", or "off" when it does not distil: then the figures say what it would cost)."""

    mode: str
    encode_ratio: float  # teacher encode per clip, in student steps (29.9 / 6.1)
    decoder_ratio: float  # the decoder's extra pass on teacher latents, in student steps
    online_step_s: float
    cached_step_s: float
    online_hours: float
    cached_hours: float
    online_gpu_hours: float
    cached_gpu_hours: float
    cache_build_gpu_hours: float  # one-off: encoding CACHE_BUILD_WINDOWS clip windows


def teacher_cost(
    cfg: TrainConfig, compute_s: float, comm_s: float, clips_per_s_per_gpu: float
) -> TeacherCost:
    """Step time and GPU-hours with the teacher online and with cached latents, from the student's
    compute time per step (student-only) and the communication per step (unchanged by the teacher)."""
    loss = cfg.loss
    mode = "cached" if loss.teacher_cache else ("online" if loss.teacher else "off")
    encode = TEACHER_ENCODE_TFLOP / STUDENT_STEP_TFLOP
    # the GPU presets train the decoder on the teacher's latents (the author's recipe); a what-if for a
    # config that does not distil assumes the same
    decoder = (
        DECODER_STEP_TFLOP / STUDENT_STEP_TFLOP if (loss.decoder_on_teacher_latents or mode == "off") else 0.0
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
    )


def teacher_to_dict(t: TeacherCost) -> dict:
    return {
        "mode": t.mode,
        "encode_tflop_per_clip_at_12x480x720": TEACHER_ENCODE_TFLOP,
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
            f"{t.online_gpu_hours:,.0f} GPU-hours (encode = {t.encode_ratio:.1f}x a student step)"
        ),
        (
            f"  cached latents  {t.cached_step_s:.3g} s/step, {hours(t.cached_hours)}, "
            f"{t.cached_gpu_hours:,.0f} GPU-hours + {t.cache_build_gpu_hours:,.0f} GPU-hours once per "
            f"{CACHE_BUILD_WINDOWS:,} clip windows (cache-latents)"
        ),
    ]
