"""Communication per optimizer step: link bandwidth (parsed, usable, formatted), bytes each GPU
moves by ZeRO stage, the share of a step it takes, and the accumulation that keeps it small."""

from __future__ import annotations

import re
from dataclasses import dataclass

from taehv_console.core.plan.memory import GB, value_bytes
from taehv_console.core.values import InputError
from trainer.config import TrainConfig
from trainer.ds_config import resolve_precision

# Of a link's nominal bit rate, what a collective really gets (framing, protocol, NCCL's own
# overhead). 0.8 turns 1 Gbit/s into the "≈100 MB/s usable" of the public arithmetic.
USABLE_LINK_FRACTION = 0.8

# Inside one node the GPUs talk over NVLink; 300 GB/s is a modest all-reduce bus bandwidth for
# 8 H100/A800 SXM GPUs (nccl-tests busbw is usually quoted at 350-480 GB/s).
INTRA_NODE_BYTES_PER_S = 300 * GB
INTER_NODE_DEFAULT = "25Gbit"  # public advice for 48 and 64 GPUs; used when a preset names none
INTRA_NODE_CPU_BYTES_PER_S = 2 * GB  # gloo over shared memory / loopback

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
        raise InputError(f"bandwidth {text!r}: expected a number and a unit, e.g. 25Gbit, 10Gbps, 2GB/s")
    number, prefix, unit = m.groups()
    value = float(number) * _PREFIX[prefix.lower()]
    if unit in ("B", "Bps", "B/s"):
        value *= 8
    if value <= 0:
        raise InputError(f"bandwidth {text!r}: must be more than 0")
    return value


def usable_bytes_per_s(bits_per_s: float) -> float:
    """What a collective really moves over a link of this nominal rate (1 Gbit/s -> 100 MB/s)."""
    return bits_per_s / 8 * USABLE_LINK_FRACTION


def format_bandwidth(bits_per_s: float) -> str:
    for unit, scale in (("Tbit", 1e12), ("Gbit", 1e9), ("Mbit", 1e6)):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:g}{unit}"
    return f"{bits_per_s:g}bit"


def link_for(nodes: int, device: str, bandwidth_bits_per_s: float | None = None) -> tuple[float, str, str]:
    """The link a collective is limited by: (usable bytes/s, its name, the assumption in words).

    Several nodes: the inter-node link (`bandwidth_bits_per_s`, else INTER_NODE_DEFAULT), since the
    ring passes each node boundary with the full per-GPU volume; one node: NVLink, or gloo for CPU
    processes."""
    if nodes > 1:
        bits = (
            bandwidth_bits_per_s if bandwidth_bits_per_s is not None else parse_bandwidth(INTER_NODE_DEFAULT)
        )
        bps = usable_bytes_per_s(bits)
        why = f"inter-node link {format_bandwidth(bits)}, {USABLE_LINK_FRACTION:.0%} usable = {bps / 1e6:,.0f} MB/s"
        return bps, f"inter-node {format_bandwidth(bits)}", why
    if device == "cpu":
        bps = INTRA_NODE_CPU_BYTES_PER_S
        return bps, "intra-node gloo", f"CPU processes exchange {bps / GB:g} GB/s over gloo"
    bps = INTRA_NODE_BYTES_PER_S
    return bps, "intra-node NVLink", f"one node: NVLink all-reduce at {bps / GB:g} GB/s"


def ring_factor(world_size: int | None) -> float:
    """Bytes each GPU moves in a ring all-reduce, per byte of payload: 2(N-1)/N; None = the large-N
    bound 2, which is what the public "201.2 MB per sync" figure for 100.6 MB of gradients uses."""
    if world_size is None:
        return 2.0
    return 2 * (world_size - 1) / world_size


def bytes_per_optimizer_step(
    params: float,
    bytes_per_value: int,
    world_size: int | None,
    zero_stage: int,
    grad_accum: int,
    *,
    bf16_zero1: bool = False,
) -> float:
    """Bytes each GPU sends (= receives) per optimizer step, by ZeRO stage, as DeepSpeed 0.19 does it.

    With f = (N-1)/N and P = params x bytes per value (the communication dtype):
    - stage 0: one gradient all-reduce at the accumulation boundary: 2fP;
    - stage 1: reduce-scatter of gradients at the boundary + all-gather of updated weights: 2fP;
      in bf16 (`bf16_zero1`, DeepSpeed's BF16_Optimizer: trainer.ds_config.zero1_runs_bf16_optimizer)
      an all-reduce at the boundary + the all-gather: 3fP;
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
    if zero_stage == 1 and bf16_zero1:
        return 3 * half * payload
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
    return value_bytes(resolve_precision(cfg, cfg.topology.device))


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
    bf16_zero1: bool = False,
) -> int | None:
    """Fewest accumulation steps keeping communication at or under `target_fraction` of a step;
    None when no accumulation can (ZeRO-2/3 communicate on every micro-step)."""
    for accum in range(1, limit + 1):
        moved = bytes_per_optimizer_step(
            params, bytes_per_value, world_size, zero_stage, accum, bf16_zero1=bf16_zero1
        )
        comm = moved / bytes_per_s
        if comm_fraction(comm, accum * compute_s_per_micro_step) <= target_fraction:
            return accum
    return None


@dataclass(frozen=True)
class CommEstimate:
    bytes_per_step: float  # per GPU, per optimizer step
    bytes_per_s: float  # usable bandwidth of the link that limits the collective
    link: str  # "inter-node 25Gbit", "intra-node NVLink", ...
    seconds_per_step: float
    fraction: float  # of a step, no overlap assumed
    smallest_accum_under_target: int | None
    target_fraction: float
