"""Flow step 3, preflight: the launch backend for the topology, the rendezvous port, and core's
checks on the chosen config. Nothing here changes the caller's options: the port chosen is part
of the result."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from taehv_console.core.cluster.preflight import PreflightOptions, first_free_port, run_preflight
from taehv_console.core.cluster.ssh import SshError, SshPool
from taehv_console.core.flow.config import ChosenConfig
from taehv_console.core.flow.options import FlowOptions
from taehv_console.core.models import BackendKind, PreflightReport, ProbeResult, Topology, TopologySource
from taehv_console.core.plan.planner import INTER_NODE_DEFAULT, parse_bandwidth
from taehv_console.core.plan.presets import load_preset
from trainer.config import ConfigError, TrainConfig

Note = Callable[[str], None]

# LAUNCHER_ENV has no backend: the console runs once per node, not inside torchrun's processes
_BACKEND_FOR_SOURCE = {
    TopologySource.HOSTFILE: BackendKind.SSH,
    TopologySource.LOCAL: BackendKind.LOCAL,
    TopologySource.SLURM: BackendKind.SLURM,
    TopologySource.PAI_DLC: BackendKind.PLATFORM,
    TopologySource.KUBEFLOW: BackendKind.PLATFORM,
    TopologySource.NODE_ENV: BackendKind.PLATFORM,
    TopologySource.K8S_INDEXED_JOB: BackendKind.PLATFORM,
}

NOT_PER_PROCESS = (
    "taehv-console runs once per node, not once per process: start it outside torchrun/accelerate "
    "(the per-process variables are set)"
)


def backend_for(options: FlowOptions, topology: Topology) -> BackendKind | None:
    """The backend asked for, else the one the topology's source implies; None inside a
    torchrun/accelerate process (see NOT_PER_PROCESS)."""
    return options.backend if options.backend is not None else _BACKEND_FOR_SOURCE.get(topology.source)


def free_port(topology: Topology, pool: SshPool, first: int | None = None) -> int:
    """The topology's port (29500 unless MASTER_PORT says otherwise) if node 0 has it free, else
    the next free one: a laptop or a shared head node often has 29500 taken. The port itself when
    node 0 does not answer (preflight reports an unreachable node properly) or none is free."""
    port = first or topology.master_port
    host = topology.hosts[0] if topology.uses_ssh else "localhost"
    try:
        found = first_free_port(pool.runner(host), port)
    except SshError:  # node 0 refused, did not resolve, or timed out: its probe's finding says so
        return port
    return port if found is None else found


def master_port(options: FlowOptions, topology: Topology, pool: SshPool) -> int:
    """--master-port, else a free port on node 0 where the console starts the nodes, else the
    platform's MASTER_PORT (every pod must use the same one)."""
    if options.master_port:
        return options.master_port
    if topology.source in (TopologySource.LOCAL, TopologySource.HOSTFILE):
        return free_port(topology, pool)
    return topology.master_port


def assumed_gbps(cfg: TrainConfig) -> float:
    """The inter-node link (Gbit/s) the plan assumed: the preset's `network` note (e.g. '25Gbit'),
    else the planner's default for a multi-node run."""
    try:
        return parse_bandwidth(load_preset(cfg.run.preset).meta.network) / 1e9
    except (ConfigError, ValueError):  # a custom config, or a preset without a network note
        return parse_bandwidth(INTER_NODE_DEFAULT) / 1e9


@dataclass(frozen=True)
class PreflightResult:
    config: TrainConfig  # the config the findings were checked against
    chosen: str  # how it was chosen
    report: PreflightReport
    backend: BackendKind | None  # None: started inside a torchrun process (refused)
    master_port: int
    notes: tuple[str, ...] = ()


def preflight(
    options: FlowOptions,
    topology: Topology,
    probes: Sequence[ProbeResult],
    chosen: ChosenConfig,
    pool: SshPool,
    note: Note | None = None,
    *,
    bandwidth: bool = False,
    bandwidth_megabytes: float = 64.0,
) -> PreflightResult:
    """Core's checks of `chosen` on these nodes, with the port the launch will use; `bandwidth`
    also measures the all-reduce bandwidth between the nodes (a few seconds), which the review's
    communication figures then use instead of the assumed link."""
    notes: list[str] = []

    def say(text: str) -> None:
        notes.append(text)
        if note is not None:
            note(text)

    cfg = chosen.config
    port = master_port(options, topology, pool)
    checks = PreflightOptions(
        runs_dir=options.runs,
        data_source=cfg.data.source,
        master_port=port,
        bandwidth=bandwidth,
        bandwidth_megabytes=bandwidth_megabytes,
        assumed_gbps=assumed_gbps(cfg),
    )
    report = run_preflight(topology, cfg, pool, checks, progress=say, probes=probes)
    return PreflightResult(
        config=cfg,
        chosen=chosen.chosen,
        report=report,
        backend=backend_for(options, topology),
        master_port=port,
        notes=tuple(notes),
    )
