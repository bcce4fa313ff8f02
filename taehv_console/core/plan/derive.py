"""Deriving a complete run config for any topology, and `auto`: pick or derive for what was detected.

The rules are the public project's, made explicit (FACTS.md): the published presets are the
anchors, and every derived value carries the reason shown on the review screen. Published
topologies derive back to their published values, except DeepSpeed's stage, buckets and overlap,
which are sized for this model's gradient and the link it crosses (zero.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from taehv_console.core.plan.communication import parse_bandwidth
from taehv_console.core.plan.planner import MemoryFit, estimate_memory, gpu_family
from taehv_console.core.plan.presets import (
    ClipFit,
    Preset,
    fitted_note,
    list_presets,
    load_preset,
    override_clip_fit,
    override_config,
)
from taehv_console.core.plan.timeouts import (
    DERIVED_TIMEOUT_RULE,
    collective_timeout_s,
    derived_collective_timeout_s,
)
from taehv_console.core.plan.zero import derive_deepspeed
from trainer.config import ConfigError, TrainConfig, config_from_dict, config_value

REFERENCE_BATCH = 128  # effective batch of the reference presets (8 and 16 GPUs)
REFERENCE_LR = 1e-4  # their LR; LR is linear in effective batch from here
MAX_BATCH_PER_GPU = 8  # the largest per-GPU batch in any public preset

# (world size, value) anchors from the published presets
WARMUP_ANCHORS = ((8, 2000), (16, 1500), (48, 1200), (64, 1000))
CHECKPOINT_ANCHORS = ((8, 2000), (16, 1000), (48, 750), (64, 500))

# NCCL/torch environment every GPU run gets (entries a preset sets itself win)
NCCL_ENV = {
    "NCCL_DEBUG": "WARN",  # NCCL's own warnings reach the node logs, where the watcher reads them
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # a failed collective ends the process: no silent hang
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",  # flight recorder: what each rank was doing ...
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",  # ... written out when a collective times out
}


# GPU families: presets tuned for one model serve its close relatives
class DeriveError(ConfigError):
    """No valid config exists for the request (e.g. one clip does not fit in GPU memory)."""


@dataclass(frozen=True)
class Reason:
    key: str  # dotted run.toml key, e.g. "optim.lr"
    value: Any
    reason: str


def fit_reasons(cfg: TrainConfig, family: str, fits: Iterable[ClipFit]) -> list[Reason]:
    """A reason for each clip value a family's clip rule moved (presets.override_clip_fit)."""
    return [Reason(f.key, config_value(cfg, f.key), fitted_note(family, [f])) for f in fits]


def apply_set(cfg: TrainConfig, overrides: list[str]) -> tuple[TrainConfig, list[Reason]]:
    """cfg with the --set overrides, and a reason for each key they set: their own, and the clip
    values a family set without a clip had fitted to its rule (presets.override_clip_fit)."""
    family, fits = override_clip_fit(cfg, overrides)
    out = override_config(cfg, overrides, fits)
    reasons = fit_reasons(out, family, fits)
    for text in overrides:
        key = text.partition("=")[0].strip()
        reasons.append(Reason(key, config_value(out, key), "set on the command line (--set)"))
    return out, reasons


@dataclass(frozen=True)
class ResolvedConfig:
    """The config a run will use, where it came from, and why each derived value is what it is."""

    config: TrainConfig
    preset: str  # the preset used as it is, or the base a config was derived from
    derived: bool
    reasons: tuple[Reason, ...]
    summary: str

    def reason_for(self, key: str) -> str | None:
        for r in self.reasons:
            if r.key == key:
                return r.reason
        return None


def target_effective_batch(world: int) -> float:
    """128 up to 16 GPUs, then 128 x sqrt(world / 16): 240 at 48 and 256 at 64 as published."""
    return float(REFERENCE_BATCH) if world <= 16 else REFERENCE_BATCH * math.sqrt(world / 16)


def lr_for(effective_batch: int) -> float:
    """1e-4 x effective/128, rounded down to 2 significant digits (1.875e-4 -> 1.8e-4, as published)."""
    raw = REFERENCE_LR * effective_batch / REFERENCE_BATCH
    exp = math.floor(math.log10(raw)) - 1
    # round() first: 2e-4 / 1e-5 is 19.999999999999996 in binary floating point, not 20; and
    # build the result from its decimal text so 1.5e-4 prints as 0.00015, not 0.00015000000000000001
    digits = math.floor(round(raw / 10**exp, 9))
    return float(f"{digits}e{exp}")


def _round_to(value: float, step: int) -> int:
    return int(step * round(value / step))


def _from_anchors(world: int, anchors: tuple[tuple[int, int], ...]) -> tuple[int, str]:
    """A value for `world` from published (world, value) anchors, and how it was obtained."""
    pts = dict(anchors)
    if world in pts:
        return pts[world], f"published value at {world} GPUs"
    lo_w, lo_v = anchors[0]
    hi_w, hi_v = anchors[-1]
    if world < lo_w:
        return lo_v, f"as at {lo_w} GPUs (the smallest published world)"
    if world > hi_w:
        v = _round_to(hi_v * math.sqrt(hi_w / world), 50)
        return (
            v,
            f"{hi_v} at {hi_w} GPUs x sqrt({hi_w}/{world}), extrapolated past the largest published world",
        )
    for (w0, v0), (w1, v1) in itertools.pairwise(anchors):
        if w0 < world < w1:
            frac = (math.log2(world) - math.log2(w0)) / (math.log2(w1) - math.log2(w0))
            v = _round_to(v0 + (v1 - v0) * frac, 50)
            return v, f"between {v0} at {w0} and {v1} at {w1} GPUs, interpolated in log2(world)"
    raise AssertionError("unreachable")  # pragma: no cover


def derive_run_config(
    base: Preset,
    nodes: int,
    gpus_per_node: int,
    *,
    gpu_memory_gb: float | None = None,
    overrides: tuple[str, ...] | list[str] = (),
) -> ResolvedConfig:
    """A complete config for nodes x gpus_per_node, from `base` by the public rules.

    Derived: topology, per-GPU batch and accumulation (effective batch by world size, per-GPU batch
    capped by the memory estimate), LR, warmup, checkpoint interval, ZeRO stage, bucket sizes and overlap,
    collective timeout, NCCL environment. Everything else (clip size, model, data, max steps)
    comes from `base`. `overrides` (--set) apply last and win over every rule.
    """
    if nodes < 1 or gpus_per_node < 1:
        raise DeriveError(f"topology {nodes} x {gpus_per_node}: nodes and processes per node must be >= 1")
    src = base.config
    device = src.topology.device
    world = nodes * gpus_per_node
    memory = gpu_memory_gb if gpu_memory_gb is not None else src.topology.gpu_memory_gb
    data = src.model_dump(mode="python")
    reasons: list[Reason] = []

    def put(key: str, value: Any, reason: str) -> None:
        section, name = key.split(".")
        data[section][name] = value
        reasons.append(Reason(key, value, reason))

    unit = "GPUs" if device == "cuda" else "CPU processes"
    put("topology.nodes", nodes, f"{nodes} node(s), stated separately from processes per node")
    put(
        "topology.gpus_per_node",
        gpus_per_node,
        f"{gpus_per_node} {unit} per node; world size {nodes} x {gpus_per_node} = {world}",
    )
    if gpu_memory_gb is not None:
        put("topology.gpu_memory_gb", memory, f"{memory:g} GB per device, as detected")

    if device == "cpu":
        reasons.append(
            Reason(
                "optim.batch_per_gpu",
                src.optim.batch_per_gpu,
                f"kept from {base.name}: a CPU run tests the machinery, not the recipe",
            )
        )
        put(
            "distributed.collective_timeout_s",
            src.distributed.collective_timeout_s,
            f"kept from {base.name}: a CPU smoke run that hangs should fail fast",
        )
        put("distributed.nccl_env", dict(src.distributed.nccl_env), "CPU processes talk over gloo: no NCCL")
        return _finish(base, data, reasons, nodes, gpus_per_node, overrides)

    # --- batch: effective batch by world size; per-GPU batch by memory --------------------------
    def one_clip_fit() -> MemoryFit:
        # the memory estimate at batch 1 on the target topology: its max_batch_per_gpu is the cap
        trial = {**data, "topology": {**data["topology"], "nodes": nodes, "gpus_per_node": gpus_per_node}}
        trial["optim"] = {**data["optim"], "batch_per_gpu": 1, "grad_accum": 1}
        return estimate_memory(config_from_dict(trial, f"derived from {base.name}"))

    fit = one_clip_fit()
    if fit.max_batch_per_gpu < 1 and not data["model"]["activation_checkpointing"]:
        put(
            "model.activation_checkpointing",
            True,
            f"one {src.data.frames}x{src.data.height}x{src.data.width} clip does not fit in {memory:g} GB "
            "without recomputing activations",
        )
        fit = one_clip_fit()
    if fit.max_batch_per_gpu < 1:
        raise DeriveError(
            f"one clip of {src.data.frames}x{src.data.height}x{src.data.width} needs more than {memory:g} GB "
            f"per GPU even with activation checkpointing (~{fit.per_gpu_gb:.0f} GB estimated); "
            "use shorter or smaller clips (data.frames, data.height, data.width)"
        )
    cap = min(MAX_BATCH_PER_GPU, fit.max_batch_per_gpu)
    target = target_effective_batch(world)
    accum = max(1, math.ceil(target / (cap * world)))
    batch = min(cap, max(1, round(target / (world * accum))))
    effective = batch * accum * world
    target_text = (
        "128 (the reference batch, up to 16 GPUs)"
        if world <= 16
        else f"128 x sqrt({world}/16) = {target:.0f} (published: 240 at 48, 256 at 64 GPUs)"
    )
    cap_text = (
        f"memory allows {fit.max_batch_per_gpu} clips of {src.data.frames}x{src.data.height}x{src.data.width} "
        f"in {memory:g} GB"
    )
    put(
        "optim.grad_accum",
        accum,
        f"fewest accumulation steps reaching the target effective batch {target_text} "
        f"with at most {cap} clips per GPU",
    )
    put(
        "optim.batch_per_gpu",
        batch,
        f"{target:.0f} / ({world} x {accum}) rounded, at most {cap} ({cap_text}; 8 is the published maximum)",
    )
    reasons.append(Reason("effective_batch", effective, f"{batch} x {accum} x {world} GPUs = {effective}"))
    lr = lr_for(effective)
    put(
        "optim.lr",
        lr,
        f"LR {lr:.2g}: 1e-4 x {effective}/128 = {REFERENCE_LR * effective / REFERENCE_BATCH:.4g}, "
        "rounded down to 2 significant digits",
    )

    # --- schedule: warmup and checkpoints shrink as the world grows -------------------------------
    warmup, how = _from_anchors(world, WARMUP_ANCHORS)
    put("optim.warmup_steps", warmup, f"{warmup} steps: {how} (published 2000/1500/1200/1000 at 8/16/48/64)")
    if world < 8:
        # same effective batch as 8 GPUs, so a step takes ~8/world times longer: keep the hours
        # between checkpoints of the 8-GPU preset, never fewer than 500 steps apart
        every = max(500, _round_to(2000 * world / 8, 50))
        how = f"2000 (8 GPUs) x {world}/8 keeps the hours between checkpoints, at least 500"
    else:
        every, how = _from_anchors(world, CHECKPOINT_ANCHORS)
    put(
        "schedule.checkpoint_every",
        every,
        f"every {every} steps: {how} (published 2000/1000/750/500 at 8/16/48/64)",
    )
    if data["schedule"]["val_every"] > every:
        put("schedule.val_every", every, "validate at least as often as a checkpoint is written")

    # --- DeepSpeed: stage, buckets and overlap sized from the gradient and the link (zero.py) -----
    asked = _asked_zero_stage(base)
    network = parse_bandwidth(base.meta.network) if base.meta.network else None
    for key, value, why in derive_deepspeed(src, nodes, world, accum, network, asked, base.name):
        put(key, value, why)

    # --- the process group -------------------------------------------------------------------------
    timeout = derived_collective_timeout_s(nodes)
    put(
        "distributed.collective_timeout_s",
        timeout,
        f"{timeout} s for {nodes} node(s) ({DERIVED_TIMEOUT_RULE}); the published presets wait "
        f"{collective_timeout_s(nodes)} s, but the console names a stalled rank within ~30 s, so a hang "
        "need not hold the cluster for hours",
    )
    env = {**NCCL_ENV, **src.distributed.nccl_env}
    kept = sorted(set(src.distributed.nccl_env) - set(NCCL_ENV))
    put(
        "distributed.nccl_env",
        env,
        "NCCL warnings in the logs, failed collectives end the process, flight recorder dumps on timeout"
        + (f"; kept from {base.name}: {', '.join(kept)}" if kept else ""),
    )
    return _finish(base, data, reasons, nodes, gpus_per_node, overrides)


def _asked_zero_stage(base: Preset) -> int | None:
    """The stage a user's own preset sets (kept); None for shipped presets (the rule decides)."""
    asked = base.explicit.get("deepspeed", {}).get("zero_stage") if isinstance(base.explicit, dict) else None
    return int(asked) if base.source != "shipped" and asked is not None else None


def _finish(
    base: Preset,
    data: dict[str, Any],
    reasons: list[Reason],
    nodes: int,
    gpus_per_node: int,
    overrides: tuple[str, ...] | list[str],
) -> ResolvedConfig:
    name = f"{base.name}@{nodes}x{gpus_per_node}"
    data["run"]["preset"] = name
    cfg = config_from_dict(data, f"derived from {base.name}")
    overrides = list(overrides)
    if overrides:
        cfg, said = apply_set(cfg, overrides)
        reasons += said
    summary = f"derived for {nodes} x {gpus_per_node} from {base.name}"
    return ResolvedConfig(config=cfg, preset=base.name, derived=True, reasons=tuple(reasons), summary=summary)


# ---------------------------------------------------------------------------------------------
# auto


def auto_select(
    nodes: int,
    gpus_per_node: int,
    *,
    device: str = "cuda",
    gpu_name: str = "",
    gpu_memory_gb: float | None = None,
    presets: tuple[Preset, ...] | None = None,
    overrides: tuple[str, ...] | list[str] = (),
) -> ResolvedConfig:
    """The preset for a detected topology: a preset made for it if there is one, else a derived one.

    A preset matches when its nodes, processes per node and device equal the detected ones and
    its GPU model is in the detected GPU's family (any, when the GPU name is unknown). User
    presets win over shipped ones. Otherwise the base is the preset of the same family (H100
    presets for unknown GPUs, cpu-smoke for CPUs) closest in world size, and the result says so.
    """
    if presets is None:
        presets = list_presets().presets
    family = "cpu" if device == "cpu" else gpu_family(gpu_name)
    same_device = [p for p in presets if p.config.topology.device == device]
    if not same_device:
        raise DeriveError(f"no preset for device {device!r}")

    def family_ok(p: Preset) -> bool:
        if device == "cpu" or family is None:
            return True
        return gpu_family(p.meta.gpu) == family

    exact = [
        p
        for p in same_device
        if p.config.topology.nodes == nodes
        and p.config.topology.gpus_per_node == gpus_per_node
        and family_ok(p)
    ]
    if family is None and device == "cuda":
        # unknown GPU: prefer the H100 presets (the public project's reference hardware)
        exact.sort(key=lambda p: gpu_family(p.meta.gpu) != "H100")
    exact.sort(key=lambda p: p.source == "shipped")  # user presets first (stable sort keeps the rest)
    what = f"{nodes} x {gpus_per_node}" + (f" {gpu_name}" if gpu_name else "")
    if exact:
        chosen = exact[0]
        cfg = chosen.config
        reasons = [Reason("preset", chosen.name, f"{chosen.name} is made for {what}")]
        if gpu_memory_gb is not None and gpu_memory_gb != cfg.topology.gpu_memory_gb:
            cfg = cfg.model_copy(
                update={"topology": cfg.topology.model_copy(update={"gpu_memory_gb": gpu_memory_gb})}
            )
            reasons.append(
                Reason(
                    "topology.gpu_memory_gb", gpu_memory_gb, f"{gpu_memory_gb:g} GB per device, as detected"
                )
            )
        if overrides:
            cfg, said = apply_set(cfg, list(overrides))
            reasons += said
        return ResolvedConfig(
            config=cfg,
            preset=chosen.name,
            derived=False,
            reasons=tuple(reasons),
            summary=f"preset {chosen.name} matches {what}",
        )

    pool = [p for p in same_device if family_ok(p)]
    if device == "cuda" and family is None:
        pool = [p for p in same_device if gpu_family(p.meta.gpu) == "H100"] or same_device
    world = nodes * gpus_per_node

    def distance(p: Preset) -> tuple[float, int, bool]:
        w = p.config.topology.world_size
        # closest in log world size; on a tie the larger world (its rules are the multi-GPU ones)
        return (abs(math.log2(world) - math.log2(w)), -w, p.source != "shipped")

    base = min(pool, key=distance)
    resolved = derive_run_config(base, nodes, gpus_per_node, gpu_memory_gb=gpu_memory_gb, overrides=overrides)
    why = f"no preset is made for {what}; derived from {base.name}, the closest in world size"
    if device == "cuda" and family is None:
        why += f" among the H100 presets (GPU {gpu_name or 'unknown'} has no preset family)"
    return ResolvedConfig(
        config=resolved.config,
        preset=base.name,
        derived=True,
        reasons=(Reason("preset", base.name, why),) + resolved.reasons,
        summary=f"derived for {what} from {base.name}",
    )


def resolve_config(
    preset: str | None,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    device: str = "cuda",
    gpu_name: str = "",
    gpu_memory_gb: float | None = None,
    overrides: tuple[str, ...] | list[str] = (),
) -> ResolvedConfig:
    """What the CLI's --preset / --nodes / --gpus-per-node / --set mean, in one place.

    - a preset and no topology: the preset as it is;
    - a preset and a topology: the preset if it is made for that topology, else derived from it;
    - "auto" (or None) and a topology: auto_select;
    - "auto" without a topology is an error (detection is the caller's job).
    """
    if (nodes is None) != (gpus_per_node is None):
        raise ConfigError("give both --nodes and --gpus-per-node (processes per node), or neither")
    overrides = list(overrides)
    if preset in (None, "", "auto"):
        if nodes is None or gpus_per_node is None:
            raise ConfigError("--preset auto needs the topology: --nodes N --gpus-per-node G")
        return auto_select(
            nodes,
            gpus_per_node,
            device=device,
            gpu_name=gpu_name,
            gpu_memory_gb=gpu_memory_gb,
            overrides=overrides,
        )
    if nodes is None or gpus_per_node is None:
        loaded = load_preset(preset, overrides=overrides)
        cfg = loaded.config
        reasons = [Reason("preset", loaded.name, f"{loaded.name} as written ({loaded.path})")]
        # a family set without a clip: the preset's clip fitted to its rule
        reasons += fit_reasons(cfg, cfg.model.family, loaded.fitted)
        if gpu_memory_gb is not None:
            cfg = cfg.model_copy(
                update={"topology": cfg.topology.model_copy(update={"gpu_memory_gb": gpu_memory_gb})}
            )
            reasons.append(
                Reason("topology.gpu_memory_gb", gpu_memory_gb, f"{gpu_memory_gb:g} GB per device, as given")
            )
        return ResolvedConfig(cfg, loaded.name, False, tuple(reasons), f"preset {loaded.name}")
    base = load_preset(preset)
    t = base.config.topology
    if (t.nodes, t.gpus_per_node) == (nodes, gpus_per_node):
        return resolve_config(preset, gpu_memory_gb=gpu_memory_gb, overrides=overrides)
    resolved = derive_run_config(base, nodes, gpus_per_node, gpu_memory_gb=gpu_memory_gb, overrides=overrides)
    return resolved
