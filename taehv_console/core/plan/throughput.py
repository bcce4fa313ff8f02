"""Throughput: clips per second per GPU by GPU model and clip size, the figure a plan's time and
cost are built on, and the time figures of a plan."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import TrainConfig
from trainer.families import DEFAULT_FAMILY
from trainer.flops import flop_per_clip_step

# GPU models each preset family is tuned for (by name fragment, as NVML reports it)
GPU_FAMILIES = {
    "H100": ("H100", "H800", "H200", "H20", "GH200"),
    "A800": ("A800", "A100"),
}


def gpu_family(gpu_name: str) -> str | None:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; None when the model is not one a preset is tuned for."""
    upper = gpu_name.upper()
    for family, members in GPU_FAMILIES.items():
        if any(m in upper for m in members):
            return family
    return None


# Throughput per GPU of taehv at the reference clip (12 x 480 x 720), scaled for another family or
# clip size by FLOPs per clip-step (trainer/flops.py: the family's own layers at that clip; about
# linear in frames x height x width, a patch-2 family a quarter of taehv's, patch 4 a sixteenth).
# Only taehv was measured: another family is assumed to run at taehv's share of the peak (an
# estimate; its smaller tensors may use the GPU less well).
REFERENCE_CLIP = (12, 480, 720)
# H100, measured with this trainer (docs/performance.md: one H100 SXM, batch 8, bf16): the trainer
# (accelerate + DeepSpeed ZeRO-2 on one rank, loader, jitter, heartbeats) compiled in channels_last
# ran 33.4 and 32.6 clips/s, the GPU presets' settings. The trainer was not timed eager; there the
# bare loop's figures (channels_last 32.4, NCHW 21.6) are scaled by the trainer's measured ratio to
# the bare loop (0.87). Gradient exchange is not in these: the plan adds it.
TRAINER_TO_BARE = 0.87
H100_CLIPS_PER_S = {
    ("channels_last", True): 33.0,
    ("channels_last", False): round(32.4 * TRAINER_TO_BARE, 1),
    ("nchw", False): round(21.6 * TRAINER_TO_BARE, 1),
}
# The public project's trainer: its 8-GPU time (111 h for 100k steps of 128 clips) is 12.8M clips /
# 111 h / 8 GPUs = 4.0 clips/s per GPU.
PUBLIC_H100_CLIPS_PER_S = 4.0
# A800 / A100, from the H100's compiled step (convolutions 64 % of its time, memory-bound fused
# elementwise kernels 34 %, the rest 2 %): convolutions scale with the dense bf16 peak (989 / 312 =
# 3.17x the time), elementwise with memory bandwidth (3.35 / 2.04 TB/s = 1.64x): 0.64 x 3.17 +
# 0.34 x 1.64 + 0.02 = 2.61x the time, 0.38x the throughput. An estimate, not a measurement.
A800_VS_H100 = 0.38
# CPU: measured on this project's dev machine, one core per process, fp32: ~0.8 s for forward,
# backward and AdamW step of one 8x64x64 clip = 1.2 clips/s, i.e. 0.01 at the reference size.
CPU_CLIPS_PER_S = 0.01
# the reference figure of each family in the GPU presets' execution settings
CLIPS_PER_S_PER_GPU = {
    "H100": H100_CLIPS_PER_S[("channels_last", True)],
    "A800": round(H100_CLIPS_PER_S[("channels_last", True)] * A800_VS_H100, 1),
    "cpu": CPU_CLIPS_PER_S,
}


def _h100(cfg: TrainConfig) -> tuple[float, str]:
    m = cfg.model
    layout = "channels_last" if m.channels_last else "nchw"
    if layout == "nchw":
        return H100_CLIPS_PER_S[("nchw", False)], "measured bare NCHW eager x 0.87"
    if m.compile:
        return H100_CLIPS_PER_S[("channels_last", True)], "measured: this trainer, compiled, channels_last"
    return H100_CLIPS_PER_S[("channels_last", False)], "measured bare channels_last eager x 0.87"


def assumed_throughput(cfg: TrainConfig, gpu: str = "") -> tuple[float, str]:
    """Clips per second per GPU (or CPU process) for cfg's clip size and execution settings
    (channels_last, compile), and where the figure comes from."""
    family = "cpu" if cfg.topology.device == "cpu" else (gpu_family(gpu) or "H100")
    if family == "cpu":
        ref, origin = CPU_CLIPS_PER_S, "measured: one core, fp32"
    else:
        ref, origin = _h100(cfg)
        if family == "A800":
            ref, origin = (
                round(ref * A800_VS_H100, 1),
                f"H100 {ref:g} x {A800_VS_H100:g}, estimated from its profile",
            )
        else:
            origin += f"; the public project's trainer: {PUBLIC_H100_CLIPS_PER_S:g}"
    d, m = cfg.data, cfg.model
    reference = flop_per_clip_step(*REFERENCE_CLIP, model=DEFAULT_FAMILY)
    own = flop_per_clip_step(d.frames, d.height, d.width, model=m)
    clips = ref * reference / own
    if cfg.model.activation_checkpointing:
        clips /= 1.3  # one extra forward of each checkpointed stage: ~30% more compute
    why = (
        f"{family} {ref:g} clips/s for {DEFAULT_FAMILY} at 12x480x720 ({origin}), scaled by FLOPs per "
        f"clip-step to {m.family} at {d.frames}x{d.height}x{d.width} ({own / 1e12:.3g} TFLOP vs "
        f"{reference / 1e12:.3g})"
    )
    if m.family != DEFAULT_FAMILY:
        why += f" (an estimate: {m.family} assumed to run at {DEFAULT_FAMILY}'s share of the peak)"
    if cfg.topology.device == "cuda" and gpu_family(gpu) is None:
        why += f" (GPU {gpu or 'unknown'}: H100 assumed)"
    if cfg.model.activation_checkpointing:
        why += ", /1.3 for activation checkpointing"
    if family != "cpu" and cfg.deepspeed.zero_stage == 3:
        why += " (measured under ZeRO-2; ZeRO-3's per-module hooks cost more)"
    return clips, why


@dataclass(frozen=True)
class TimeEstimate:
    clips_per_s_per_gpu: float
    compute_s_per_step: float
    step_s: float
    clips_per_s: float  # whole run
    hours_to_max_steps: float
    gpu_hours: float
    cost: float | None  # gpu_hours x price, when a price per GPU-hour is given
