"""The process group's collective timeout: the published rule, the shorter one derived configs
get, and the words the planner uses to explain a config's value.

A collective waits this long for a missing peer before NCCL/gloo abort the job. The published
presets pick hours. The console names a stalled rank within ~30 s (heartbeats, process state), so a
derived config only has to outlast the longest legitimate wait inside a collective: peers waiting
while rank 0 writes a checkpoint or runs validation (seconds to a few minutes for this 11.3M
model), and communicator set-up, which grows with the node count."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the Review screen imports this before pydantic is loaded
    from trainer.config import TrainConfig

PUBLISHED_TIMEOUT_RULE = "published: 1 node 3600 s, 2-5 nodes 7200 s, 6-7 nodes 10800 s, 8+ nodes 14400 s"
DERIVED_TIMEOUT_RULE = "derived: 600 s up to 10 nodes, +30 s per node beyond, at most 1800 s"


def collective_timeout_s(nodes: int) -> int:
    """The public rule: 1 node 3600 s, 2-5 nodes 7200 s, 6-7 nodes 10800 s, 8 or more 14400 s."""
    if nodes <= 1:
        return 3600
    if nodes <= 5:
        return 7200
    if nodes <= 7:
        return 10800
    return 14400


def derived_collective_timeout_s(nodes: int) -> int:
    """Minutes, not hours: 600 s up to 10 nodes, 30 s more per node beyond (communicator set-up
    and the slowest node's checkpoint write grow with the node count), at most 1800 s."""
    return min(1800, 600 + 30 * max(0, nodes - 10))


def explain_collective_timeout(cfg: TrainConfig) -> str:
    """What a config's collective timeout is and where it comes from, for plan output and Review."""
    value = cfg.distributed.collective_timeout_s
    nodes = cfg.topology.nodes
    published, derived = collective_timeout_s(nodes), derived_collective_timeout_s(nodes)
    text = f"{value} s ({value / 60:g} min) before a hung collective ends the run"
    if cfg.topology.device == "cuda" and value == derived:
        return (
            f"{text}: {DERIVED_TIMEOUT_RULE}; the console names a stalled rank within ~30 s, "
            f"so a hang need not hold {nodes} node(s) for the published {published} s"
        )
    if cfg.topology.device == "cuda" and value == published:
        return (
            f"{text}: as published for {nodes} node(s) ({PUBLISHED_TIMEOUT_RULE}); a derived config "
            f"would wait {derived} s, since the console names a stalled rank within ~30 s"
        )
    return f"{text}: as the preset or --set gives it; the console names a stalled rank within ~30 s"


def collective_timeout_brief(cfg: TrainConfig) -> str:
    """The same in one short line (the Review screen's row at 80 columns)."""
    value = cfg.distributed.collective_timeout_s
    nodes = cfg.topology.nodes
    published, derived = collective_timeout_s(nodes), derived_collective_timeout_s(nodes)
    if cfg.topology.device == "cuda" and value == derived:
        return f"{value} s, derived: a stall is named in ~30 s (published {published} s)"
    if cfg.topology.device == "cuda" and value == published:
        return f"{value} s, as published (derived configs: {derived} s)"
    return f"{value} s, as the preset or --set gives it"
