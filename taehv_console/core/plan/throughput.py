"""Throughput: clips per second per GPU by GPU model and clip size, the figure a plan's time and
cost are built on, and the time figures of a plan."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import TrainConfig

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


# Throughput per GPU at the reference clip (12 x 480 x 720), scaled by pixel-frames for other
# clip sizes (the cost of every layer is linear in frames x height x width).
REFERENCE_CLIP = (12, 480, 720)
# H100: the public 8-GPU time (111 h for 100k steps of 128 clips) is 12.8M clips / 111 h / 8 GPUs
# = 4.0 clips/s per GPU. The public 16-GPU measurement (115 clips/s of 12x480x480) would give
# 4.8 at 480x720; 4.0 is the more conservative of the two and reproduces the baseline row.
# A800: H100 x 0.61, the ratio of memory bandwidth (2.04 / 3.35 TB/s): at 3-4% of peak FLOPs
# this model is not compute-bound, so the FLOP ratio (0.32) would be too pessimistic.
# CPU: measured on this project's dev machine, one core per process, fp32: ~0.8 s for forward,
# backward and AdamW step of one 8x64x64 clip = 1.2 clips/s, i.e. 0.01 at the reference size.
CLIPS_PER_S_PER_GPU = {"H100": 4.0, "A800": 2.4, "cpu": 0.01}


def assumed_throughput(cfg: TrainConfig, gpu: str = "") -> tuple[float, str]:
    """Clips per second per GPU (or CPU process) for cfg's clip size, and where the figure comes from."""
    family = "cpu" if cfg.topology.device == "cpu" else (gpu_family(gpu) or "H100")
    ref = CLIPS_PER_S_PER_GPU[family]
    f, h, w = REFERENCE_CLIP
    d = cfg.data
    clips = ref * (f * h * w) / (d.frames * d.height * d.width)
    if cfg.model.activation_checkpointing:
        clips /= 1.3  # one extra forward of each checkpointed stage: ~30% more compute
    origin = {
        "H100": "public 8-GPU time",
        "A800": "H100 x 0.61, memory bandwidth ratio",
        "cpu": "measured: one core, fp32",
    }[family]
    why = f"{family} {ref:g} clips/s at 12x480x720 ({origin}), scaled to {d.frames}x{d.height}x{d.width}"
    if cfg.topology.device == "cuda" and gpu_family(gpu) is None:
        why += f" (GPU {gpu or 'unknown'}: H100 assumed)"
    if cfg.model.activation_checkpointing:
        why += ", /1.3 for activation checkpointing"
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
