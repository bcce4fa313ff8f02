"""Flow steps 4-5, launch plan and review: where each node starts and with which master, the
planner's figures, and the exact command every node runs, before anything is created. Also the
platform case, where this pod launches its own node of a run every pod shares."""

from __future__ import annotations

import dataclasses
import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from taehv_console.core.cluster.ssh import SshPool, master_address
from taehv_console.core.flow.config import ChosenConfig
from taehv_console.core.flow.detect import spare_hosts
from taehv_console.core.flow.options import FlowOptions
from taehv_console.core.flow.preflight import NOT_PER_PROCESS, PreflightResult, preflight
from taehv_console.core.models import BackendKind, Finding, ProbeResult, Topology
from taehv_console.core.plan.planner import Plan, format_bandwidth, make_plan
from taehv_console.core.plan.render import (
    RenderOptions,
    accelerate_config_name,
    launch_command,
    launch_env,
    render_accelerate_yaml,
)
from taehv_console.core.run.create import LaunchSpec
from taehv_console.core.run.rundir import RunDir, create_run_dir, new_run_id
from taehv_console.core.run.state import Phase, RunState
from trainer.config import TrainConfig, config_to_toml

Note = Callable[[str], None]


class PlatformRunError(ValueError):
    """A platform pod cannot launch its node of this run; the message says what to change."""


def launch_spec(
    options: FlowOptions, topology: Topology, backend: BackendKind, master_port: int, pool: SshPool
) -> LaunchSpec:
    """Hosts (machine-rank order) and the master address for this topology and backend."""
    if backend is BackendKind.SSH:
        hosts = tuple(topology.hosts)
        master = master_address(hosts[0], pool.settings)
    elif backend is BackendKind.LOCAL:
        hosts, master = ("localhost",), "127.0.0.1"
    else:  # slurm, sbatch (platform launches through prepare_platform_node)
        hosts, master = tuple(topology.hosts), topology.master_addr
    return LaunchSpec(
        backend=backend,
        hosts=hosts,
        master_addr=master,
        master_port=master_port or 29500,
        env=dict(options.env),
        spares=spare_hosts(options) if backend is BackendKind.SSH else (),
    )


@dataclass(frozen=True)
class NodeLaunch:
    node: int
    host: str
    command: str  # shell-quoted argv, exactly what the node's launcher runs


@dataclass(frozen=True)
class Review:
    plan: Plan
    config: TrainConfig
    chosen: str
    run_id: str
    run_path: str
    created_at: float  # the run id's time: launch creates this very id
    backend: BackendKind
    hosts: tuple[str, ...]
    master: str
    master_port: int
    commands: tuple[NodeLaunch, ...]
    env: tuple[tuple[str, str], ...]
    spec: LaunchSpec  # what the launch starts: exactly the hosts, master and env shown
    findings: tuple[Finding, ...] = ()  # preflight on this config when it differs from the checked one
    blocked: str = ""  # why a launch is refused ("" = ready)
    bandwidth: str = ""  # measured or assumed link


def review(
    options: FlowOptions,
    topology: Topology,
    probes: Sequence[ProbeResult],
    checked: PreflightResult,
    chosen: ChosenConfig,
    pool: SshPool,
    note: Note | None = None,
    now: float | None = None,
) -> Review:
    """The planner's figures and the exact per-node commands for `chosen`; preflight again when
    the config is not the one preflight checked (a changed preset or override can break the fit)."""
    cfg = chosen.config
    now = time.time() if now is None else now
    findings: tuple[Finding, ...] = ()
    blocked = ""
    if cfg != checked.config:
        again = preflight(options, topology, probes, chosen, pool, note)
        findings = again.report.findings
        if not again.report.ok:
            blocked = f"preflight found {len(again.report.errors)} error(s) for this config"
    elif not checked.report.ok:
        blocked = f"preflight found {len(checked.report.errors)} error(s)"
    if checked.backend is None:
        blocked = blocked or NOT_PER_PROCESS
    gpu = next(
        (p.facts.visible_gpus[0].name for p in probes if p.facts is not None and p.facts.visible_gpus), ""
    )
    bw = checked.report.bandwidth
    bits = bw.busbw_gbps * 8e9 if bw is not None else None
    plan = make_plan(cfg, gpu=gpu, bandwidth_bits_per_s=bits)
    backend = checked.backend or BackendKind.LOCAL
    spec = launch_spec(options, topology, backend, checked.master_port, pool)
    run_id = new_run_id(cfg.run.preset, now)
    run_path = str(Path(options.runs).absolute() / run_id)
    opts = RenderOptions(run_dir=run_path)
    hosts = spec.hosts if len(spec.hosts) == cfg.topology.nodes else ("localhost",) * cfg.topology.nodes
    commands = tuple(
        NodeLaunch(i, hosts[i] if i < len(hosts) else "?", shlex.join(launch_command(cfg, i, opts)))
        for i in range(cfg.topology.nodes)
    )
    env = {**launch_env(cfg), **dict(spec.env)}
    link = format_bandwidth(bits) + " measured" if bits else (plan.comm.link + " (assumed)")
    return Review(
        plan=plan,
        config=cfg,
        chosen=chosen.chosen,
        run_id=run_id,
        run_path=run_path,
        created_at=now,
        backend=backend,
        hosts=spec.hosts,
        master=spec.master_addr,
        master_port=spec.master_port,
        commands=commands,
        env=tuple(sorted(env.items())),
        findings=findings,
        blocked=blocked,
        bandwidth=link,
        spec=spec,
    )


# ------------------------------------------------------------------------------------ platform


@dataclass(frozen=True)
class PlatformNode:
    run: RunDir
    state: RunState  # what this pod's controller starts from
    rank: int  # this pod's node (machine rank)
    nodes: int
    master_addr: str
    master_port: int


def prepare_platform_node(
    options: FlowOptions, topology: Topology, cfg: TrainConfig, existing: RunDir | None, master_port: int
) -> PlatformNode:
    """A pod/container's share of a run: node 0 may create the run; every pod writes its own
    accelerate config with the master the platform gave. PlatformRunError when the pods cannot
    agree on one run (no shared run named) or the config's node count is not the platform's."""
    rank = topology.this_node_rank or 0
    nodes = topology.node_count
    if nodes > 1 and existing is None:
        raise PlatformRunError(
            f"{topology.source.value}: node {rank} of {nodes}: every pod must name the same run: "
            "--run DIR on shared storage, or --preset DIR/run.toml as the rendered Kubernetes "
            "Job does"
        )
    if cfg.topology.nodes != nodes:
        raise PlatformRunError(
            f"the run's config has {cfg.topology.nodes} node(s) but the platform started {nodes}: "
            f"render the run for {nodes} node(s)"
        )
    run = existing or create_run_dir(options.runs, cfg.run.preset)
    run.logs.mkdir(parents=True, exist_ok=True)
    if existing is None:
        run.run_toml.write_text(config_to_toml(cfg))
    opts = RenderOptions(
        run_dir=str(run.path), main_process_ip=topology.master_addr, main_process_port=master_port
    )
    target = run.path / accelerate_config_name(rank)
    # a temp name of our own: every pod writes into the same shared directory
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(render_accelerate_yaml(cfg, rank, opts))
    os.replace(tmp, target)
    state = RunState(
        run_id=run.run_id,
        phase=Phase.CREATED,
        backend=BackendKind.PLATFORM,
        hosts=(),
        master_addr=topology.master_addr,
        master_port=master_port,
        created=time.time(),
        env=tuple(sorted(options.env.items())),
        controlled=(rank,),
    )
    if rank == 0 and run.has_state():
        state = dataclasses.replace(run.read_state(), controlled=(0,), backend=BackendKind.PLATFORM)
    return PlatformNode(
        run=run,
        state=state,
        rank=rank,
        nodes=nodes,
        master_addr=topology.master_addr,
        master_port=master_port,
    )
