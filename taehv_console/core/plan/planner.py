"""Planner arithmetic: communication per optimizer step, time and cost, and memory fit per GPU.

Pure functions of a TrainConfig and a few stated assumptions (bandwidth, throughput); every
assumption is a named constant or argument so the figures can be checked by hand. Units: bytes,
seconds; "GB" and "MB" are decimal (1e9, 1e6), as the public arithmetic in FACTS.md uses them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from taehv_console.core.plan.footprint import activation_elements, parameter_count
from taehv_console.core.plan.timeouts import explain_collective_timeout
from trainer.config import TrainConfig
from trainer.ds_config import resolve_precision

GB = 1e9
MB = 1e6

# Of a link's nominal bit rate, what a collective really gets (framing, protocol, NCCL's own
# overhead). 0.8 turns 1 Gbit/s into the "≈100 MB/s usable" of the public arithmetic.
USABLE_LINK_FRACTION = 0.8

# Inside one node the GPUs talk over NVLink; 300 GB/s is a modest all-reduce bus bandwidth for
# 8 H100/A800 SXM GPUs (nccl-tests busbw is usually quoted at 350-480 GB/s).
INTRA_NODE_BYTES_PER_S = 300 * GB

# Fixed per-process memory the model does not explain: CUDA context, cuBLAS/cuDNN handles and
# NCCL's buffers on a GPU; the Python + torch runtime on a CPU process.
FRAMEWORK_GB = {"cuda": 1.0, "cpu": 0.5}
# Caching-allocator fragmentation and kernel workspaces, as a fraction of activation memory.
WORKSPACE_FRACTION = 0.10

# ---------------------------------------------------------------------------------------------
# Memory fit


@dataclass(frozen=True)
class MemoryFit:
    """Estimated memory per GPU (or per CPU process) for one training process of a config.

    `breakdown` (GB) sums to `per_gpu_gb`; `fits` compares it with `gpu_gb`, the memory the
    config's topology states. `max_batch_per_gpu` is the largest micro-batch that would fit
    (0 when not even one clip does).
    """

    fits: bool
    per_gpu_gb: float
    gpu_gb: float
    breakdown: dict[str, float] = field(hash=False)
    notes: tuple[str, ...]
    parameters: int
    activations_per_clip_gb: float
    max_batch_per_gpu: int


def _bytes_per_value(precision: str) -> int:
    return 2 if precision in ("bf16", "fp16") else 4


def model_state_bytes(params: int, zero_stage: int, world_size: int, precision: str) -> dict[str, float]:
    """Weights, gradients and optimizer state per process, partitioned as ZeRO does.

    Mixed precision (ZeRO paper accounting): 16-bit weights 2 B, 16-bit gradients 2 B, and
    AdamW's fp32 master weights + exp_avg + exp_avg_sq 12 B per parameter. fp32 training: weights
    4 B, gradients 4 B, exp_avg + exp_avg_sq 8 B. Stage 1 splits the optimizer state over the
    data-parallel ranks, stage 2 also the gradients, stage 3 also the weights.
    """
    b = _bytes_per_value(precision)
    opt_per_param = 12 if b == 2 else 8
    n = world_size
    weights = params * b / (n if zero_stage >= 3 else 1)
    grads = params * b / (n if zero_stage >= 2 else 1)
    optim = params * opt_per_param / (n if zero_stage >= 1 else 1)
    return {"weights": weights, "gradients": grads, "optimizer": optim}


def comm_buffer_bytes(cfg: TrainConfig, params: int, precision: str) -> float:
    """The flat buffers DeepSpeed allocates for gradient reduction and ZeRO-3 gathering.

    As DeepSpeed 0.19 does it: ZeRO-1/2 with contiguous_gradients allocate reduce_bucket_size
    elements once, twice with overlap_comm (double buffering), in the gradient dtype (fp32 for
    stage 1); ZeRO-3 one reduce bucket plus up to stage3_max_live_parameters gathered weights,
    which for this model is never more than the whole model. Stage 0 reduces in place.
    """
    ds = cfg.deepspeed
    b = _bytes_per_value(precision)
    if ds.zero_stage in (1, 2) and ds.contiguous_gradients:
        dtype_bytes = 4 if ds.zero_stage == 1 else b
        return ds.reduce_bucket_size * dtype_bytes * (2 if ds.overlap_comm else 1)
    if ds.zero_stage == 3:
        reduce = ds.reduce_bucket_size * b if ds.contiguous_gradients else 0
        live = min(ds.stage3_max_live_parameters, params) * b
        return reduce + live
    return 0.0


def estimate_memory(cfg: TrainConfig) -> MemoryFit:
    """Memory per GPU for `cfg`: model states by ZeRO stage, DeepSpeed buffers, activations.

    Activations come from `footprint.activation_elements` (a layer-by-layer count of what autograd
    keeps for one clip of frames x height x width plus backward's gradients through the largest
    stage, checked against a measured step, see there), times the micro-batch, at 2 bytes in
    bf16/fp16 and 4 in fp32; checkpointing keeps stage inputs plus one recomputed stage.
    A workspace margin (10% of activations) and a fixed framework share (1 GB per GPU, 0.5 GB per
    CPU process) cover what the count leaves out. Expect +-30%: it is for "fits or not", not for
    the last gigabyte.
    """
    device = cfg.topology.device
    precision = resolve_precision(cfg, device)
    b = _bytes_per_value(precision)
    params = parameter_count(cfg.model).total
    world = cfg.topology.world_size
    stage = cfg.deepspeed.zero_stage

    states = model_state_bytes(params, stage, world, precision)
    buffers = comm_buffer_bytes(cfg, params, precision)
    acts = activation_elements(cfg.model, cfg.data.frames, cfg.data.height, cfg.data.width)
    per_clip = acts.peak * b
    fixed = sum(states.values()) + buffers + FRAMEWORK_GB[device] * GB

    def total_for(batch: int) -> float:
        return fixed + batch * per_clip * (1 + WORKSPACE_FRACTION)

    batch = cfg.optim.batch_per_gpu
    breakdown_bytes = {
        **states,
        "comm_buffers": buffers,
        "activations": batch * per_clip,
        "workspace": batch * per_clip * WORKSPACE_FRACTION,
        "framework": FRAMEWORK_GB[device] * GB,
    }
    breakdown = {k: round(v / GB, 3) for k, v in breakdown_bytes.items()}
    total = total_for(batch)
    gpu_bytes = cfg.topology.gpu_memory_gb * GB
    max_batch = max(0, math.floor((gpu_bytes - fixed) / (per_clip * (1 + WORKSPACE_FRACTION))))
    fits = total <= gpu_bytes

    notes: list[str] = []
    unit = "GPU" if device == "cuda" else "process"
    if not fits:
        advice = (
            f"lower optim.batch_per_gpu to {max_batch} (and raise grad_accum to keep the effective batch)"
            if max_batch >= 1
            else "shorter or smaller clips (data.frames, data.height, data.width)"
        )
        if not cfg.model.activation_checkpointing:
            advice += ", or set model.activation_checkpointing = true"
        notes.append(
            f"does not fit: ~{total / GB:.1f} GB needed per {unit}, {cfg.topology.gpu_memory_gb:g} GB "
            f"available; {advice}"
        )
    # 16 bytes per parameter either way: 2+2+12 in mixed precision, 4+4+8 in fp32
    unsharded = params * 16 / MB
    if stage == 3:
        notes.append(
            f"ZeRO-3 cannot help: weights, gradients and optimizer state of this "
            f"{params / 1e6:.1f}M-parameter model are ~{unsharded:.0f} MB per {unit} unsharded; "
            "ZeRO-3 only adds a parameter all-gather per layer in forward and backward. "
            "ZeRO-2 is enough."
        )
    if stage in (1, 2, 3) and buffers > 4 * params * b:
        notes.append(
            f"reduce_bucket_size {cfg.deepspeed.reduce_bucket_size:.3g} elements is "
            f"{cfg.deepspeed.reduce_bucket_size / params:.0f}x the whole gradient ({params:,} elements); "
            f"its buffers take {buffers / GB:.2f} GB per {unit} and a bucket of "
            f"{_round_up_bucket(params):.3g} would hold the gradient in one piece"
        )
    if cfg.loss.teacher:
        notes.append("the teacher VAE's weights and activations are not included in this estimate")
    return MemoryFit(
        fits=fits,
        per_gpu_gb=round(total / GB, 3),
        gpu_gb=cfg.topology.gpu_memory_gb,
        breakdown=breakdown,
        notes=tuple(notes),
        parameters=params,
        activations_per_clip_gb=round(per_clip / GB, 4),
        max_batch_per_gpu=max_batch,
    )


def _round_up_bucket(params: int) -> float:
    """The next 1/2/5 x 10^k at or above `params`: a round bucket that holds the whole gradient."""
    exp = 10 ** math.floor(math.log10(params))
    for m in (1, 2, 5, 10):
        if m * exp >= params:
            return float(m * exp)
    return float(10 * exp)  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# Bandwidth

_BANDWIDTH = re.compile(
    r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMgGtT]?)(bit|bps|b|B|Bps|B/s|bit/s|b/s)?\s*$"
)
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str) -> float:
    """'25Gbit', '10Gbps', '100Gb', '1.5GB/s', '400M' -> nominal bits per second.

    Lower-case b or "bit" is bits, upper-case B is bytes; no unit means bits (links are sold in bits).
    """
    m = _BANDWIDTH.match(text)
    if not m:
        raise ValueError(f"bandwidth {text!r}: expected a number and a unit, e.g. 25Gbit, 10Gbps, 2GB/s")
    number, prefix, unit = m.groups()
    value = float(number) * _PREFIX[prefix.lower()]
    if unit in ("B", "Bps", "B/s"):
        value *= 8
    if value <= 0:
        raise ValueError(f"bandwidth {text!r}: must be more than 0")
    return value


def usable_bytes_per_s(bits_per_s: float) -> float:
    """What a collective really moves over a link of this nominal rate (1 Gbit/s -> 100 MB/s)."""
    return bits_per_s / 8 * USABLE_LINK_FRACTION


def format_bandwidth(bits_per_s: float) -> str:
    for unit, scale in (("Tbit", 1e12), ("Gbit", 1e9), ("Mbit", 1e6)):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:g}{unit}"
    return f"{bits_per_s:g}bit"


# ---------------------------------------------------------------------------------------------
# Communication


def ring_factor(world_size: int | None) -> float:
    """Bytes each GPU moves in a ring all-reduce, per byte of payload: 2(N-1)/N; None = the large-N
    bound 2, which is what the public "201.2 MB per sync" figure for 100.6 MB of gradients uses."""
    if world_size is None:
        return 2.0
    return 2 * (world_size - 1) / world_size


def bytes_per_optimizer_step(
    params: float, bytes_per_value: int, world_size: int | None, zero_stage: int, grad_accum: int
) -> float:
    """Bytes each GPU sends (= receives) per optimizer step, by ZeRO stage, as DeepSpeed 0.19 does it.

    With f = (N-1)/N and P = params x bytes per value (the communication dtype):
    - stage 0: one gradient all-reduce at the accumulation boundary: 2fP;
    - stage 1: reduce-scatter of gradients at the boundary + all-gather of updated weights: 2fP;
    - stage 2: gradients are reduce-scattered after *every* micro-step (DeepSpeed partitions them
      as backward produces them), weights all-gathered once: grad_accum x fP + fP;
    - stage 3: per micro-step, weights all-gathered in forward and again in backward, gradients
      reduce-scattered: grad_accum x 3fP.
    So accumulation only amortises communication under stages 0 and 1.
    """
    if world_size == 1:
        return 0.0
    half = ring_factor(world_size) / 2  # f
    payload = params * bytes_per_value
    if zero_stage in (0, 1):
        return 2 * half * payload
    if zero_stage == 2:
        return (grad_accum + 1) * half * payload
    return grad_accum * 3 * half * payload


def comm_fraction(comm_s: float, compute_s: float) -> float:
    """Share of a step spent communicating, with no overlap assumed (an upper bound)."""
    total = comm_s + compute_s
    return comm_s / total if total > 0 else 0.0


def comm_bytes_per_value(cfg: TrainConfig) -> int:
    """DeepSpeed communicates in communication_data_type, else in the training precision."""
    explicit = cfg.deepspeed.communication_data_type
    if explicit != "auto":
        return 4 if explicit == "fp32" else 2
    return _bytes_per_value(resolve_precision(cfg, cfg.topology.device))


def smallest_accumulation(
    target_fraction: float,
    *,
    params: float,
    bytes_per_value: int,
    world_size: int | None,
    zero_stage: int,
    compute_s_per_micro_step: float,
    bytes_per_s: float,
    limit: int = 4096,
) -> int | None:
    """Fewest accumulation steps keeping communication at or under `target_fraction` of a step;
    None when no accumulation can (ZeRO-2/3 communicate on every micro-step)."""
    for accum in range(1, limit + 1):
        comm = bytes_per_optimizer_step(params, bytes_per_value, world_size, zero_stage, accum) / bytes_per_s
        if comm_fraction(comm, accum * compute_s_per_micro_step) <= target_fraction:
            return accum
    return None


# ---------------------------------------------------------------------------------------------
# Time and cost

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
INTER_NODE_DEFAULT = "25Gbit"  # public advice for 48 and 64 GPUs; used when a preset names none
INTRA_NODE_CPU_BYTES_PER_S = 2 * GB  # gloo over shared memory / loopback


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


# ---------------------------------------------------------------------------------------------
# Checkpoints and failures

# Meta's Llama 3 report ("The Llama 3 Herd of Models", arXiv:2407.21783, section 3.3.4, Table 5):
# 419 unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs, i.e.
# 419 / (54 x 24 x 16,384) = 1.97e-5 per GPU-hour. The 47 planned interruptions are left out.
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
LLAMA3_FAILURES_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
LLAMA3_SOURCE = (
    f"Meta's Llama 3 report, arXiv:2407.21783 section 3.3.4: {LLAMA3_INTERRUPTIONS} unexpected "
    f"interruptions in {LLAMA3_DAYS} days on {LLAMA3_GPUS:,} H100 GPUs"
)
# Shared storage the run directory lives on (NFS, Lustre, a cloud file share), as one stream:
# 1 GB/s is a modest figure for such storage, and every rank writes into the same directory.
STORAGE_BYTES_PER_S = 1 * GB
# A checkpoint crosses the storage twice: the ranks write it, then rank 0 reads every file back to
# hash it for the manifest (trainer/checkpoint.py finalize).
CHECKPOINT_STORAGE_PASSES = 2
# What a save costs whatever its size, an estimate (not measured on a GPU cluster): two barriers,
# DeepSpeed's save_checkpoint, gathering the fp32 and EMA weights parameter by parameter, fsync of
# every file and directory, the rename and `latest`.
CHECKPOINT_FIXED_S = 10.0
# From a failure to training again, an estimate: the console sees the failure (a dead process at
# once; a hang takes longer), tears the attempt down, waits recovery.backoff_s (10 s by default),
# relaunches (accelerate, DeepSpeed, NCCL) and verifies and loads the newest checkpoint.
RESTART_S = 120.0


def checkpoint_bytes(
    params: int, zero_stage: int, world_size: int, precision: str, ema: bool
) -> dict[str, float]:
    """Bytes one checkpoint writes, summed over the ranks, by part (trainer/train.py save_checkpoint).

    - DeepSpeed's weights (2 B per parameter in bf16/fp16, 4 in fp32) and optimizer state (12 B:
      fp32 master + exp_avg + exp_avg_sq; 8 B in fp32), as `model_state_bytes` counts them: ZeRO
      splits these over the ranks' files but the sum is the same at every stage;
    - the consolidated fp32 weights (weights.safetensors): 4 B;
    - with EMA, each rank's fp32 EMA of its master partition (4 B in all under ZeRO 1-3, a whole
      copy per rank under stage 0) and the consolidated EMA weights: 4 B.
    Not counted: the discriminator (adversarial.weight > 0) and the small per-rank RNG state.
    """
    whole = model_state_bytes(params, 0, 1, precision)
    parts = {
        "weights": whole["weights"],
        "optimizer": whole["optimizer"],
        "weights_fp32": 4.0 * params,
    }
    if ema:
        parts["ema_state"] = 4.0 * params * (world_size if zero_stage == 0 else 1)
        parts["ema_weights_fp32"] = 4.0 * params
    return parts


def checkpoint_save_s(
    total_bytes: float,
    bytes_per_s: float = STORAGE_BYTES_PER_S,
    fixed_s: float = CHECKPOINT_FIXED_S,
    passes: int = CHECKPOINT_STORAGE_PASSES,
) -> float:
    """Seconds one save stops training, an estimate: passes x bytes / storage bandwidth + fixed_s."""
    return passes * total_bytes / bytes_per_s + fixed_s


def checkpoint_interval_s(every_steps: int, step_s: float) -> float:
    """Seconds between checkpoints: checkpoint_every x step time."""
    return every_steps * step_s


def cluster_mtbf_s(failures_per_gpu_hour: float, gpus: int) -> float:
    """The run's mean time between failures in seconds: 3600 / (rate per GPU-hour x GPUs). One
    failing GPU stops a synchronous run, so the rate grows with the number of GPUs."""
    if failures_per_gpu_hour <= 0 or gpus < 1:
        raise ValueError(
            f"failure rate {failures_per_gpu_hour:g} per GPU-hour on {gpus} GPU(s): both more than 0"
        )
    return 3600 / (failures_per_gpu_hour * gpus)


def loss_per_failure_s(interval_s: float, restart_s: float = RESTART_S) -> float:
    """Seconds a failure costs on average: interval / 2 (the work since the last checkpoint, redone)
    + restart_s (detection, teardown, relaunch)."""
    return interval_s / 2 + restart_s


def expected_failures(run_s: float, mtbf_s: float) -> float:
    """Failures expected during a run: run time / MTBF."""
    return run_s / mtbf_s


def checkpoint_overhead_s(
    run_s: float, interval_s: float, save_s: float, mtbf_s: float, restart_s: float = RESTART_S
) -> float:
    """Seconds a run is expected to lose to checkpointing at this interval, first order:
    (run / interval) x save + (run / MTBF) x (interval / 2 + restart). The sum Young/Daly minimises."""
    saves = run_s / interval_s * save_s
    return saves + expected_failures(run_s, mtbf_s) * loss_per_failure_s(interval_s, restart_s)


def young_daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that loses least, Young's first-order optimum (Young 1974; Daly 2006):
    interval = sqrt(2 x save x MTBF). Valid while the save is short against the MTBF."""
    return math.sqrt(2 * save_s * mtbf_s)


def round_steps(steps: float, max_steps: int) -> int:
    """A step count to 2 significant digits (5,425 -> 5,400), at least 1, at most max_steps."""
    if steps < 1:
        return 1
    scale = 10 ** max(0, math.floor(math.log10(steps)) - 1)
    return max(1, min(round(steps / scale) * scale, max_steps))


@dataclass(frozen=True)
class CheckpointEstimate:
    """What a failure costs at the config's checkpoint interval, and the interval Young/Daly gives.

    Seconds of wall time; a GPU-hours figure is wall hours x `gpus` (every GPU waits or redoes).
    """

    every_steps: int
    interval_s: float
    bytes_by_part: dict[str, float] = field(hash=False)
    storage_bytes_per_s: float
    save_s: float  # an estimate: CHECKPOINT_STORAGE_PASSES x bytes / storage + CHECKPOINT_FIXED_S
    failures_per_gpu_hour: float
    failure_rate_source: str  # LLAMA3_SOURCE, or "given"
    gpus: int
    mtbf_s: float
    run_s: float  # to max steps, at the planned step time
    expected_failures: float  # during the run
    restart_s: float
    loss_per_failure_s: float  # interval / 2 + restart
    expected_loss_s: float  # expected failures x loss per failure
    save_overhead_s: float  # every save of the run: run / interval x save
    young_daly_s: float  # sqrt(2 x save x MTBF), before rounding to steps
    recommended_steps: int
    capped_at_max_steps: bool  # Young/Daly's interval is longer than the whole run
    recommended_interval_s: float  # recommended_steps x step time
    recommended_overhead_s: float  # saves + expected failure loss at the recommended interval
    saved_s: float  # overhead at the config's interval - at the recommended one

    @property
    def bytes(self) -> float:
        return sum(self.bytes_by_part.values())

    @property
    def overhead_s(self) -> float:
        return self.save_overhead_s + self.expected_loss_s

    def gpu_hours(self, seconds: float) -> float:
        return seconds * self.gpus / 3600


def estimate_checkpointing(
    cfg: TrainConfig,
    step_s: float,
    failures_per_gpu_hour: float | None = None,
    *,
    storage_bytes_per_s: float = STORAGE_BYTES_PER_S,
    restart_s: float = RESTART_S,
) -> CheckpointEstimate:
    """The checkpoint figures for `cfg` at `step_s` seconds per optimizer step; the failure rate per
    GPU-hour defaults to Llama 3's (LLAMA3_FAILURES_PER_GPU_HOUR)."""
    source = LLAMA3_SOURCE if failures_per_gpu_hour is None else "given"
    rate = LLAMA3_FAILURES_PER_GPU_HOUR if failures_per_gpu_hour is None else failures_per_gpu_hour
    gpus = cfg.topology.world_size
    parts = checkpoint_bytes(
        parameter_count(cfg.model).total,
        cfg.deepspeed.zero_stage,
        gpus,
        resolve_precision(cfg, cfg.topology.device),
        cfg.optim.ema_decay > 0,
    )
    save = checkpoint_save_s(sum(parts.values()), storage_bytes_per_s)
    mtbf = cluster_mtbf_s(rate, gpus)
    max_steps = cfg.optim.max_steps
    run_s = step_s * max_steps
    every = cfg.schedule.checkpoint_every
    interval = checkpoint_interval_s(every, step_s)
    per_failure = loss_per_failure_s(interval, restart_s)
    failures = expected_failures(run_s, mtbf)
    young = young_daly_interval_s(save, mtbf)
    capped = young / step_s > max_steps
    steps = round_steps(young / step_s, max_steps)
    recommended = checkpoint_interval_s(steps, step_s)
    overhead = checkpoint_overhead_s(run_s, interval, save, mtbf, restart_s)
    recommended_overhead = checkpoint_overhead_s(run_s, recommended, save, mtbf, restart_s)
    return CheckpointEstimate(
        every_steps=every,
        interval_s=interval,
        bytes_by_part=parts,
        storage_bytes_per_s=storage_bytes_per_s,
        save_s=save,
        failures_per_gpu_hour=rate,
        failure_rate_source=source,
        gpus=gpus,
        mtbf_s=mtbf,
        run_s=run_s,
        expected_failures=failures,
        restart_s=restart_s,
        loss_per_failure_s=per_failure,
        expected_loss_s=failures * per_failure,
        save_overhead_s=run_s / interval * save,
        young_daly_s=young,
        recommended_steps=steps,
        capped_at_max_steps=capped,
        recommended_interval_s=recommended,
        recommended_overhead_s=recommended_overhead,
        saved_s=overhead - recommended_overhead,
    )


@dataclass(frozen=True)
class CommEstimate:
    bytes_per_step: float  # per GPU, per optimizer step
    bytes_per_s: float  # usable bandwidth of the link that limits the collective
    link: str  # "inter-node 25Gbit", "intra-node NVLink", ...
    seconds_per_step: float
    fraction: float  # of a step, no overlap assumed
    smallest_accum_under_target: int | None
    target_fraction: float


@dataclass(frozen=True)
class TimeEstimate:
    clips_per_s_per_gpu: float
    compute_s_per_step: float
    step_s: float
    clips_per_s: float  # whole run
    hours_to_max_steps: float
    gpu_hours: float
    cost: float | None  # gpu_hours x price, when a price per GPU-hour is given


@dataclass(frozen=True)
class Plan:
    name: str
    config: TrainConfig
    comm: CommEstimate
    time: TimeEstimate
    memory: MemoryFit
    assumptions: tuple[str, ...]
    teacher: TeacherCost | None = None
    collective_timeout: str = ""  # the timeout and why (derived configs wait minutes, not hours)
    checkpoint: CheckpointEstimate | None = None  # what a failure costs, and the interval to save at


def make_plan(
    cfg: TrainConfig,
    *,
    name: str = "",
    gpu: str = "",
    bandwidth_bits_per_s: float | None = None,
    clips_per_s_per_gpu: float | None = None,
    efficiency: float = 1.0,
    target_fraction: float = 0.1,
    price_per_gpu_hour: float | None = None,
    failures_per_gpu_hour: float | None = None,
) -> Plan:
    """Communication, time, cost and memory for one config.

    Step time = accumulation x micro-batch / (throughput x efficiency) + communication, with no
    overlap of the two (the public arithmetic's convention; overlap_comm can only make it faster).
    Communication crosses the inter-node link when there are several nodes (the ring passes each
    node boundary with the full per-GPU volume), else NVLink (or gloo for CPU processes).
    Checkpointing (`estimate_checkpointing`) at that step time, with `failures_per_gpu_hour`
    interruptions per GPU-hour (None: Llama 3's, LLAMA3_FAILURES_PER_GPU_HOUR).
    """
    if not 0 < efficiency <= 1:
        raise ValueError(f"efficiency {efficiency}: must be in (0, 1]")
    assumptions: list[str] = []
    t = cfg.topology
    params = parameter_count(cfg.model).total
    bpv = comm_bytes_per_value(cfg)

    if t.nodes > 1:
        bits = (
            bandwidth_bits_per_s if bandwidth_bits_per_s is not None else parse_bandwidth(INTER_NODE_DEFAULT)
        )
        bps = usable_bytes_per_s(bits)
        link = f"inter-node {format_bandwidth(bits)}"
        assumptions.append(
            f"inter-node link {format_bandwidth(bits)}, {USABLE_LINK_FRACTION:.0%} usable = {bps / MB:,.0f} MB/s"
        )
    elif t.device == "cpu":
        bps, link = INTRA_NODE_CPU_BYTES_PER_S, "intra-node gloo"
        assumptions.append(f"CPU processes exchange {bps / GB:g} GB/s over gloo")
    else:
        bps, link = INTRA_NODE_BYTES_PER_S, "intra-node NVLink"
        assumptions.append(f"one node: NVLink all-reduce at {bps / GB:g} GB/s")

    if clips_per_s_per_gpu is None:
        clips_per_s_per_gpu, why = assumed_throughput(cfg, gpu)
        assumptions.append(why)
    else:
        assumptions.append(f"throughput {clips_per_s_per_gpu:g} clips/s per GPU (given)")
    if efficiency < 1:
        assumptions.append(f"scaling efficiency {efficiency:g} on compute")

    micro_s = cfg.optim.batch_per_gpu / (clips_per_s_per_gpu * efficiency)
    compute_s = cfg.optim.grad_accum * micro_s
    step_bytes = bytes_per_optimizer_step(
        params, bpv, t.world_size, cfg.deepspeed.zero_stage, cfg.optim.grad_accum
    )
    comm_s = step_bytes / bps
    comm = CommEstimate(
        bytes_per_step=step_bytes,
        bytes_per_s=bps,
        link=link,
        seconds_per_step=comm_s,
        fraction=comm_fraction(comm_s, compute_s),
        smallest_accum_under_target=smallest_accumulation(
            target_fraction,
            params=params,
            bytes_per_value=bpv,
            world_size=t.world_size,
            zero_stage=cfg.deepspeed.zero_stage,
            compute_s_per_micro_step=micro_s,
            bytes_per_s=bps,
        ),
        target_fraction=target_fraction,
    )
    teacher = teacher_cost(cfg, compute_s, comm_s, clips_per_s_per_gpu * efficiency)
    step_s = compute_s + comm_s
    if teacher.mode != "off":
        step_s = teacher.online_step_s if teacher.mode == "online" else teacher.cached_step_s
        compute_s = step_s - comm_s
        assumptions.append(
            f"teacher VAE {teacher.mode}: its encode ({TEACHER_ENCODE_TFLOP:g} TFLOP per 12x480x720 clip) is "
            f"{teacher.encode_ratio:.1f}x the student's {STUDENT_STEP_TFLOP:g} TFLOP step, at the student's rate"
            + (
                f"; the decoder's pass on teacher latents adds {teacher.decoder_ratio:.2f}x"
                if teacher.decoder_ratio
                else ""
            )
            + ("; cached: paid once by cache-latents" if teacher.mode == "cached" else "")
        )
    hours = step_s * cfg.optim.max_steps / 3600
    gpu_hours = hours * t.world_size
    time = TimeEstimate(
        clips_per_s_per_gpu=clips_per_s_per_gpu,
        compute_s_per_step=compute_s,
        step_s=step_s,
        clips_per_s=cfg.effective_batch / step_s,
        hours_to_max_steps=hours,
        gpu_hours=gpu_hours,
        cost=gpu_hours * price_per_gpu_hour if price_per_gpu_hour is not None else None,
    )
    return Plan(
        name=name or cfg.run.preset,
        config=cfg,
        comm=comm,
        time=time,
        memory=estimate_memory(cfg),
        assumptions=tuple(assumptions),
        teacher=teacher,
        collective_timeout=explain_collective_timeout(cfg),
        checkpoint=estimate_checkpointing(cfg, step_s, failures_per_gpu_hour),
    )


@dataclass(frozen=True)
class ComparisonRow:
    plan: Plan
    speedup: float  # baseline hours / these hours
    relative_cost: float  # these GPU-hours / baseline GPU-hours


def compare_plans(plans: list[Plan], baseline: Plan) -> list[ComparisonRow]:
    """The public comparison table's shape: time, GPU-hours, speed-up and cost against a baseline."""
    b = baseline.time
    return [
        ComparisonRow(
            plan=p,
            speedup=b.hours_to_max_steps / p.time.hours_to_max_steps,
            relative_cost=p.time.gpu_hours / b.gpu_hours,
        )
        for p in plans
    ]


def plan_to_dict(plan: Plan, row: ComparisonRow | None = None) -> dict:
    """A JSON-ready view of a plan (the CLI's --json and anything else that wants plain values)."""
    c = plan.config
    t = c.topology
    out: dict[str, Any] = {
        "name": plan.name,
        "topology": {
            "nodes": t.nodes,
            "gpus_per_node": t.gpus_per_node,
            "world_size": t.world_size,
            "device": t.device,
        },
        "batch": {
            "per_gpu": c.optim.batch_per_gpu,
            "grad_accum": c.optim.grad_accum,
            "effective": c.effective_batch,
        },
        "zero_stage": c.deepspeed.zero_stage,
        "collective_timeout": {"seconds": c.distributed.collective_timeout_s, "why": plan.collective_timeout},
        "communication": {
            "bytes_per_step": plan.comm.bytes_per_step,
            "link": plan.comm.link,
            "usable_bytes_per_s": plan.comm.bytes_per_s,
            "seconds_per_step": plan.comm.seconds_per_step,
            "fraction": plan.comm.fraction,
            "target_fraction": plan.comm.target_fraction,
            "smallest_accum_under_target": plan.comm.smallest_accum_under_target,
        },
        "time": {
            "clips_per_s_per_gpu": plan.time.clips_per_s_per_gpu,
            "compute_s_per_step": plan.time.compute_s_per_step,
            "step_s": plan.time.step_s,
            "clips_per_s": plan.time.clips_per_s,
            "max_steps": c.optim.max_steps,
            "hours_to_max_steps": plan.time.hours_to_max_steps,
            "gpu_hours": plan.time.gpu_hours,
            "cost": plan.time.cost,
        },
        "memory": {
            "fits": plan.memory.fits,
            "per_gpu_gb": plan.memory.per_gpu_gb,
            "gpu_gb": plan.memory.gpu_gb,
            "breakdown_gb": dict(plan.memory.breakdown),
            "max_batch_per_gpu": plan.memory.max_batch_per_gpu,
            "notes": list(plan.memory.notes),
        },
        "assumptions": list(plan.assumptions),
    }
    if plan.teacher is not None:
        out["teacher"] = teacher_to_dict(plan.teacher)
    if plan.checkpoint is not None:
        out["checkpointing"] = checkpoint_to_dict(plan.checkpoint)
    if row is not None:
        out["speedup_vs_baseline"] = row.speedup
        out["relative_cost_vs_baseline"] = row.relative_cost
    return out


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


def teacher_lines(t: TeacherCost, hours) -> list[str]:
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


def checkpoint_to_dict(c: CheckpointEstimate) -> dict:
    """The checkpoint figures as plain values (seconds, hours and GPU-hours side by side)."""

    def cost(seconds: float) -> dict[str, float]:
        return {"seconds": seconds, "hours": seconds / 3600, "gpu_hours": c.gpu_hours(seconds)}

    return {
        "every_steps": c.every_steps,
        "interval_s": c.interval_s,
        "interval_hours": c.interval_s / 3600,
        "save": {
            "estimate": True,
            "bytes": c.bytes,
            "bytes_by_part": dict(c.bytes_by_part),
            "storage_bytes_per_s": c.storage_bytes_per_s,
            "storage_passes": CHECKPOINT_STORAGE_PASSES,
            "fixed_s": CHECKPOINT_FIXED_S,
            "seconds": c.save_s,
            "formula": "passes x bytes / storage_bytes_per_s + fixed_s",
        },
        "failures": {
            "per_gpu_hour": c.failures_per_gpu_hour,
            "source": c.failure_rate_source,
            "gpus": c.gpus,
            "mtbf_hours": c.mtbf_s / 3600,
            "expected_in_run": c.expected_failures,
        },
        "restart_s": c.restart_s,
        "loss_per_failure": cost(c.loss_per_failure_s),
        "expected_loss": cost(c.expected_loss_s),
        "save_overhead": cost(c.save_overhead_s),
        "young_daly": {
            "formula": "sqrt(2 x save_s x mtbf_s)",
            "interval_s": c.young_daly_s,
            "every_steps": c.recommended_steps,
            "capped_at_max_steps": c.capped_at_max_steps,
            "recommended_interval_s": c.recommended_interval_s,
            "recommended_interval_hours": c.recommended_interval_s / 3600,
            "overhead": cost(c.recommended_overhead_s),
            "saved_vs_config": cost(c.saved_s),
        },
    }


def format_duration(seconds: float) -> str:
    """'45 s', '8.3 min', '2.22 h', '4.6 d': the unit that keeps the number readable."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.3g} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} d"


def checkpoint_lines(c: CheckpointEstimate, unit: str = "GPU") -> list[str]:
    """The text a plan prints about checkpoints and failures (CLI, and the wizard's Review); `unit`
    is "GPU", or "process" for CPU runs."""
    if c.failure_rate_source == "given":
        source = f"given; Meta's Llama 3 report gives {LLAMA3_FAILURES_PER_GPU_HOUR:.3g}"
    else:
        source = f"from {c.failure_rate_source}"
    steps = f"every {c.recommended_steps:,} steps ({format_duration(c.recommended_interval_s)})"
    if c.recommended_steps == c.every_steps:
        verdict = f"{steps}, the config's interval"
    elif c.saved_s > 0:
        verdict = (
            f"{steps} would lose {format_duration(c.saved_s)} = {c.gpu_hours(c.saved_s):,.2f} {unit}-hours "
            f"less than every {c.every_steps:,}"
        )
    else:
        verdict = f"{steps}, no better than every {c.every_steps:,} (rounding)"
    if c.capped_at_max_steps:
        verdict += " (max_steps: Young/Daly's interval is longer than the run)"
    return [
        (
            f"every {c.every_steps:,} steps = {format_duration(c.interval_s)}; a save stops training "
            f"~{format_duration(c.save_s)} (estimate: {c.bytes / MB:,.0f} MB written and read back at "
            f"{c.storage_bytes_per_s / GB:g} GB/s + {CHECKPOINT_FIXED_S:g} s)"
        ),
        (
            f"failure rate {c.failures_per_gpu_hour:.3g} per {unit}-hour x {c.gpus} {unit}s: MTBF "
            f"{c.mtbf_s / 3600:,.0f} h, {c.expected_failures:.2g} failures expected in the run's "
            f"{format_duration(c.run_s)}"
        ),
        f"  ({source})",
        (
            f"a failure loses {format_duration(c.loss_per_failure_s)} = "
            f"{c.gpu_hours(c.loss_per_failure_s):,.1f} {unit}-hours on average (half an interval + "
            f"{format_duration(c.restart_s)} restart)"
        ),
        (
            f"expected over the run: {c.gpu_hours(c.expected_loss_s):,.2f} {unit}-hours lost to failures, "
            f"{c.gpu_hours(c.save_overhead_s):,.2f} to the saves themselves"
        ),
        f"Young/Daly sqrt(2 x save x MTBF) = {format_duration(c.young_daly_s)}: {verdict}",
    ]
