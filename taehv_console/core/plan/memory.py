"""Memory fit per GPU (or CPU process) for a config: model states by ZeRO stage, DeepSpeed's
buffers, activations, and the units (decimal GB and MB) every planner figure uses."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from taehv_console.core.plan.footprint import activation_elements, parameter_count
from trainer.config import TrainConfig
from trainer.ds_config import resolve_precision, zero1_runs_bf16_optimizer

GB = 1e9
MB = 1e6

# Fixed per-process memory the model does not explain: CUDA context, cuBLAS/cuDNN handles and
# NCCL's buffers on a GPU; the Python + torch runtime on a CPU process.
FRAMEWORK_GB = {"cuda": 1.0, "cpu": 0.5}
# Caching-allocator fragmentation and kernel workspaces, as a fraction of activation memory.
WORKSPACE_FRACTION = 0.10


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


def value_bytes(precision: str) -> int:
    """Bytes per value in a precision: 2 in bf16 and fp16, 4 in fp32."""
    return 2 if precision in ("bf16", "fp16") else 4


def model_state_bytes(params: int, zero_stage: int, world_size: int, precision: str) -> dict[str, float]:
    """Weights, gradients and optimizer state per process, partitioned as ZeRO does.

    Mixed precision (ZeRO paper accounting): 16-bit weights 2 B, 16-bit gradients 2 B, and
    AdamW's fp32 master weights + exp_avg + exp_avg_sq 12 B per parameter. fp32 training: weights
    4 B, gradients 4 B, exp_avg + exp_avg_sq 8 B. Stage 1 splits the optimizer state over the
    data-parallel ranks, stage 2 also the gradients, stage 3 also the weights.
    """
    b = value_bytes(precision)
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
    return bucket_buffer_bytes(
        ds.zero_stage,
        ds.reduce_bucket_size,
        ds.overlap_comm,
        precision,
        contiguous_gradients=ds.contiguous_gradients,
        gathered=min(ds.stage3_max_live_parameters, params),
        params=params,
    )


def bucket_buffer_bytes(
    zero_stage: int,
    reduce_bucket_size: int,
    overlap_comm: bool,
    precision: str,
    *,
    contiguous_gradients: bool = True,
    gathered: int = 0,
    params: int = 0,
) -> float:
    """comm_buffer_bytes from the settings themselves; `gathered`: ZeRO-3's live weights (elements).

    bf16 ZeRO-1 runs as DeepSpeed's BF16_Optimizer (trainer.ds_config.zero1_runs_bf16_optimizer):
    no reduce buckets, but an fp32 buffer the size of the whole gradient (`params` elements) that
    micro-batches accumulate into and the step all-reduces."""
    b = value_bytes(precision)
    if zero1_runs_bf16_optimizer(zero_stage, precision):
        return 4.0 * params
    if zero_stage in (1, 2) and contiguous_gradients:
        dtype_bytes = 4 if zero_stage == 1 else b
        return reduce_bucket_size * dtype_bytes * (2 if overlap_comm else 1)
    if zero_stage == 3:
        reduce = reduce_bucket_size * b if contiguous_gradients else 0
        return reduce + gathered * b
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
    b = value_bytes(precision)
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
            f"{round_up_bucket(params):.3g} would hold the gradient in one piece"
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


def round_up_bucket(params: int) -> int:
    """The next 1/2/5 x 10^k at or above `params`: a round bucket that holds the whole gradient."""
    exp = 10 ** math.floor(math.log10(params))
    for m in (1, 2, 5, 10):
        if m * exp >= params:
            return int(m * exp)
    return int(10 * exp)  # pragma: no cover
