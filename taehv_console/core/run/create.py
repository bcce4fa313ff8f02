"""A new run directory: run.toml, the launch files rendered for the real hosts and master, and
state.json in phase `created`, from a config and where its nodes start (LaunchSpec)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from taehv_console.core.models import BackendKind
from taehv_console.core.plan.render import RenderOptions, write_launch_files
from taehv_console.core.run.rundir import RunDir, create_run_dir
from taehv_console.core.run.state import Phase, RunState
from trainer.config import TrainConfig


@dataclass(frozen=True)
class LaunchSpec:
    """Where and how the run's nodes start. `hosts` in machine-rank order (the ssh aliases for the
    ssh backend); `controlled` the nodes this console starts (all, except on a platform)."""

    backend: BackendKind
    hosts: tuple[str, ...]
    master_addr: str
    master_port: int
    env: Mapping[str, str] = field(default_factory=dict)
    controlled: tuple[int, ...] | None = None
    spares: tuple[str, ...] = ()  # hosts that may take a left-out node's place (ssh)


def create_run(runs_dir: str | Path, cfg: TrainConfig, spec: LaunchSpec, run: RunDir | None = None) -> RunDir:
    """Write a new run directory (or fill a given one): run.toml, the rendered launch files with
    the real hosts and master, and state.json in phase `created`."""
    run = run or create_run_dir(runs_dir, cfg.run.preset)
    run.logs.mkdir(parents=True, exist_ok=True)
    nodes = cfg.topology.nodes
    hosts = spec.hosts if len(spec.hosts) == nodes else ()
    write_launch_files(
        cfg,
        run.path,
        RenderOptions(
            run_dir=str(run.path),
            hosts=hosts,
            main_process_ip=spec.master_addr,
            main_process_port=spec.master_port,
        ),
    )
    controlled = spec.controlled if spec.controlled is not None else tuple(range(nodes))
    state = RunState(
        run_id=run.run_id,
        phase=Phase.CREATED,
        backend=spec.backend,
        hosts=tuple(spec.hosts),
        master_addr=spec.master_addr,
        master_port=spec.master_port,
        created=time.time(),
        env=tuple(sorted(spec.env.items())),
        controlled=controlled,
        spares=tuple(spec.spares),
    )
    run.write_state(state)
    return run
