"""A run's config for fewer nodes, after the console left a bad node out (core/run/excluding.py):
the same recipe at a smaller world size, the effective batch kept through gradient accumulation
where it divides, each change with its reason.

Everything that shapes the model or its optimizer state stays: the ZeRO stage (the universal
checkpoint the run resumes from is loaded into the stage it had), the learning rate and schedule
(steps keep their meaning while the effective batch is kept), the data recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import TrainConfig


@dataclass(frozen=True)
class Reshaped:
    config: TrainConfig
    changes: tuple[str, ...]  # one line per changed value, with its reason


def for_nodes(cfg: TrainConfig, nodes: int) -> Reshaped:
    """`cfg` on `nodes` nodes of the same size (fewer than it has)."""
    t = cfg.topology
    if not 1 <= nodes < t.nodes:
        raise ValueError(f"a run on {t.nodes} node(s) cannot be reshaped to {nodes}")
    world = nodes * t.gpus_per_node
    per_step = cfg.optim.batch_per_gpu * world  # clips per optimizer step at accumulation 1
    target = cfg.effective_batch
    changes = [
        (
            f"topology.nodes: {t.nodes} -> {nodes} (world size {t.world_size} -> {world}): "
            "the node left out is not replaced"
        )
    ]
    accum = cfg.optim.grad_accum
    if target % per_step == 0:
        accum = target // per_step
        if accum != cfg.optim.grad_accum:
            changes.append(
                f"optim.grad_accum: {cfg.optim.grad_accum} -> {accum}: keeps the effective batch at "
                f"{target} clips ({cfg.optim.batch_per_gpu} per GPU x {world} GPUs x {accum}), so the "
                "learning rate and the schedule's steps keep their meaning"
            )
    else:
        changes.append(
            f"effective batch: {target} -> {cfg.optim.batch_per_gpu * world * accum} clips: "
            f"{target} is not a multiple of {per_step} ({cfg.optim.batch_per_gpu} per GPU x {world} "
            f"GPUs), so optim.grad_accum stays {accum}; the learning rate is kept as it was"
        )
    out = cfg.model_copy(
        update={
            "topology": t.model_copy(update={"nodes": nodes}),
            "optim": cfg.optim.model_copy(update={"grad_accum": accum}),
        }
    )
    # validated again as a whole (model_copy skips validators): a reshaped config must load
    return Reshaped(TrainConfig.model_validate(out.model_dump()), tuple(changes))
