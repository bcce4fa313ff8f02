"""FLOPs of a TAEHV training step and the GPUs' dense bf16 peaks: MFU, as the trainer reports it
(the step event's `mfu`) and benchmarks/gpu_throughput.py measures it. No torch here: the console
reads it too."""

from __future__ import annotations

# FACTS (the author's model, counted per 12x480x720 clip): forward 0.628 TFLOP in the encoder and
# 1.413 TFLOP in the decoder; a training step is forward + backward (twice the forward) of both,
# ~6.1 TFLOP. Every layer's cost is linear in frames x height x width (tests/test_gpu_throughput_smoke.py
# checks this against torch's own count on the meta device).
ENCODER_FORWARD = 0.628e12
DECODER_FORWARD = 1.413e12
FLOP_PER_CLIP_STEP = 6.1e12
REFERENCE_VOXELS = 12 * 480 * 720
DECODER_SHARE = DECODER_FORWARD / (ENCODER_FORWARD + DECODER_FORWARD)

# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, matched in order against the device name that
# torch / NVML report (e.g. "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200"). FACTS.md
# gives the H100 SXM's 989; the rest are NVIDIA's datasheets, which print the sparse figure (twice
# the dense one): H100 SXM 1,979 / PCIe 1,513 / NVL 1,671; H200 SXM 1,979 / NVL 1,671; A100 and
# A800 312 dense; L40S 733 sparse (362 dense).
DATASHEET_BF16_DENSE: tuple[tuple[tuple[str, ...], float, str], ...] = (
    (("H100", "PCIE"), 756.0, "NVIDIA H100 datasheet, PCIe: 1,513 sparse"),
    (("H100", "NVL"), 835.0, "NVIDIA H100 datasheet, NVL: 1,671 sparse"),
    (("H100",), 989.0, "FACTS.md; NVIDIA H100 datasheet, SXM: 1,979 sparse"),
    (("H200", "NVL"), 835.0, "NVIDIA H200 datasheet, NVL: 1,671 sparse"),
    (("H200",), 989.0, "NVIDIA H200 datasheet, SXM: 1,979 sparse"),
    (("A100",), 312.0, "NVIDIA A100 datasheet"),
    (("A800",), 312.0, "NVIDIA A800 datasheet (A100 silicon)"),
    (("L40S",), 362.0, "NVIDIA L40S datasheet: 733 sparse"),
)
H100_BF16_PEAK = 989e12  # the goal's card (H100 SXM), FLOP/s
# Below this share of the peak a run is crawling: the public project's 3-4 %; this model reaches
# ~20 % on an H100 with channels_last and compile (docs/performance.md).
LOW_MFU = 0.10


def flop_per_clip_step(frames: int, height: int, width: int, teacher_decode: bool = False) -> float:
    """FLOPs of one training step of one clip: forward and backward of encode and decode, plus (the
    distillation recipe with decoder_on_teacher_latents) a second decode, of the teacher's latents."""
    scale = (1.0 + DECODER_SHARE) if teacher_decode else 1.0
    return FLOP_PER_CLIP_STEP * scale * frames * height * width / REFERENCE_VOXELS


def datasheet_peak(name: str) -> tuple[float | None, str]:
    """(dense bf16 TFLOP/s, where the figure comes from) for a device name; (None, why) if unknown."""
    upper = name.upper()
    for keys, tflops, source in DATASHEET_BF16_DENSE:
        if all(k in upper for k in keys):
            return tflops, source
    return None, f"no datasheet figure for {name!r}"


def mfu(
    clips_per_s: float,
    frames: int,
    height: int,
    width: int,
    gpus: int,
    peak_tflops: float,
    teacher_decode: bool = False,
) -> float:
    """Model FLOPs utilisation per GPU: the step's model FLOPs at `clips_per_s` (clips, or crops,
    of frames x height x width over the whole run) against `gpus` x the dense bf16 peak. The
    teacher's own forward and the discriminator are not the model's FLOPs and are not counted."""
    return (
        clips_per_s * flop_per_clip_step(frames, height, width, teacher_decode) / (gpus * peak_tflops * 1e12)
    )
