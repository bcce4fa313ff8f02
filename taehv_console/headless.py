"""`taehv-console --no-tui`: the console's flow without a screen, on the same core as the TUI.

detect -> preflight (errors end it: exit PREFLIGHT_FAILED, findings printed) -> preset (auto, or
--preset) -> launch, or attach when this run is already live -> progress until the run ends.
SIGTERM/SIGINT stop the whole run gracefully (checkpoint), then exit STOPPED; a second signal cuts
the grace period short. On a machine without GPUs and without --data the cpu-smoke preset trains
on generated clips, so the README's main command works on a laptop.

Progress: a rich progress bar when stdout is a terminal, timestamped lines otherwise (container
logs), and with --json one JSON object per line (trainer events as they are, plus the console's
own `phase`, `note` and a final `result`). Each validation's samples are named once, when
their index.json appears: the step's directory and each clip's PSNR, PNG and video.

Imported on the --no-tui path and by the commands that follow a run, not by `taehv-console --help`
(its exit codes live in exit_codes.py).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from taehv_console.core.cluster.platform import TopologyError
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.config import run_config
from taehv_console.core.flow.detect import detect
from taehv_console.core.flow.launch import PlatformNode, launch_spec, prepare_platform_node
from taehv_console.core.flow.options import FlowOptions
from taehv_console.core.flow.preflight import NOT_PER_PROCESS, backend_for, preflight
from taehv_console.core.flow.runs import find_live_run
from taehv_console.core.models import BackendKind, PreflightReport
from taehv_console.core.run.client import supervised_client
from taehv_console.core.run.control import RunController
from taehv_console.core.run.create import LaunchSpec, create_run
from taehv_console.core.run.outcome import LaunchError, settled
from taehv_console.core.run.rundir import (
    RunDir,
    RunsDirError,
    family_fields,
    family_text,
    resolve_run,
    runs_dir_problem,
)
from taehv_console.core.run.state import StateError
from taehv_console.errors import describe_error
from taehv_console.exit_codes import ExitCode
from taehv_console.follow import (
    JsonView,
    View,
    follow,
    follow_client,
    follow_run,
    make_view,
    report_ended,
    report_outcome,
)
from trainer import checkpoint as ckpt
from trainer.config import TrainConfig

# ------------------------------------------------------------------------------------- the flow


def _fail(view: View, code: ExitCode, message: str) -> ExitCode:
    if isinstance(view, JsonView):
        view.result({"phase": None, "exit_code": int(code), "exit_name": code.name.lower(), "error": message})
    else:
        print(f"taehv-console: {message}", file=sys.stderr)
    return code


def run(options: FlowOptions, json_mode: bool = False) -> int:
    """The whole headless flow; returns an ExitCode."""
    view = make_view(json_mode)
    try:
        return int(_run(options, view))
    except Exception as err:  # noqa: BLE001 - one line and a code (errors.py), in JSON under --json
        return _fail(view, *describe_error(err))
    except KeyboardInterrupt:
        # before `follow` took over the signals: detection, preflight or the launch itself
        return _fail(
            view,
            ExitCode.INTERRUPTED,
            "interrupted; a run already launched keeps running "
            "(see `taehv-console status`, stop it with `taehv-console stop`)",
        )
    finally:
        view.close()


def _run(options: FlowOptions, view: View) -> ExitCode:
    if not options.run and options.preset.endswith("run.toml") and os.path.isfile(options.preset):
        # a platform pod: the rendered run's directory is the run
        options = dataclasses.replace(options, run=os.path.dirname(os.path.abspath(options.preset)))
    with SshPool(options.ssh) as pool:
        # errors end the flow through run() (errors.py maps them: a missing or damaged run, a bad
        # hostfile or config 2, a busy run 5)
        existing = resolve_run(options.run, options.runs) if options.run else None
        view.note("detecting the cluster")
        found = detect(options, pool)
        topology, probes = found.topology, found.probes
        backend = backend_for(options, topology)
        if backend is None:
            raise TopologyError(NOT_PER_PROCESS)
        runs_problem = runs_dir_problem(options.runs)  # before demo clips or a run are written there
        if runs_problem:
            raise RunsDirError(runs_problem)
        # 1. a run that is already live: attach to it, never launch it twice
        if backend is not BackendKind.PLATFORM:
            lost = existing.lost_state() if existing is not None else None
            if lost:
                # a launched run whose state.json is gone: never launched afresh over its
                # files (a platform pod's run has no state until its node 0 writes one)
                raise StateError(lost)
            candidate = existing if existing is not None and existing.has_state() else None
            if existing is None:
                hosts = tuple(topology.hosts) if topology.uses_ssh else ("localhost",)
                live = find_live_run(options.runs, pool, hosts=hosts, on_skip=view.note)
                candidate = RunDir(Path(live.path)) if live is not None else None
            if candidate is not None:
                code = _attach_if_live(candidate, pool, view, options, named=existing is not None)
                if code is not None:
                    return code
        # 2. config, preflight
        chosen = run_config(options, topology, probes, existing, view.note)
        if backend is BackendKind.SBATCH:
            # SLURM picks the nodes after submission: nothing here to check them against
            view.note(
                "sbatch: preflight runs inside the job, on the nodes SLURM allocates; an error "
                "ends the job before training (reports in RUN/preflight/)"
            )
            spec = launch_spec(options, topology, backend, options.master_port or 29500, pool)
            return _launch_new(options, chosen.config, spec, pool, view, existing)
        checked = preflight(options, topology, probes, chosen, pool, view.note)
        _print_findings(view, checked.report, checked.chosen)
        if not checked.report.ok:
            return ExitCode.PREFLIGHT_FAILED
        # 3. launch
        if backend is BackendKind.PLATFORM:
            node = prepare_platform_node(options, topology, checked.config, existing, checked.master_port)
            return _platform(node, options, pool, view)
        spec = launch_spec(options, topology, backend, checked.master_port, pool)
        return _launch_new(options, checked.config, spec, pool, view, existing)


def _attach_if_live(
    run: RunDir, pool: SshPool, view: View, options: FlowOptions, named: bool
) -> ExitCode | None:
    """Attach when the run's processes are alive (RunBusyError when another console has it);
    None when the run should be launched (not live, never started)."""
    client = supervised_client(run, pool)
    if client is not None and not client.settled():
        view.note(f"{run.run_id} is running under its supervisor: following it instead of launching")
        client.grace_s = options.grace_s or None
        return follow_client(client, view)
    ctrl = RunController.open(run, pool, purpose="attach (--no-tui)")
    try:
        if ctrl.attempt is None:
            return None  # created, never started: launch it
        # a failure nobody judged yet, a restart's backoff: following carries the run on
        if ctrl.reconcile() != "live" and settled(ctrl.state):
            if named:  # the named run has ended: show how, do not start it again behind the user's back
                view.note(f"{run.run_id} is not running; to continue it: taehv-console resume {run.path}")
                return report_ended(ctrl, view)
            return None
        view.note(f"{run.run_id} is running: attaching to it instead of launching")
        return follow_run(ctrl, view, options.grace_s)
    finally:
        ctrl.close()


def _print_findings(view: View, report: PreflightReport, chosen: str) -> None:
    if isinstance(view, JsonView):
        view.emit(
            {
                "source": "console",
                "kind": "preflight",
                "time": time.time(),
                "config": chosen,
                **report.to_dict(),
            }
        )
        return
    view.note(f"config: {chosen}")
    for f in report.findings:
        if f.severity.value == "info":
            continue
        view.note(f"{f.severity.value}: {f.message}" + (f" (fix: {f.fix})" if f.fix else ""))
    if not report.ok:
        view.note(f"preflight: {len(report.errors)} error(s); nothing was started")


def _launch_new(
    options: FlowOptions,
    cfg: TrainConfig,
    spec: LaunchSpec,
    pool: SshPool,
    view: View,
    existing: RunDir | None,
) -> ExitCode:
    run = create_run(options.runs, cfg, spec, run=existing)
    view.note(f"run {run.run_id} in {run.path}")
    view.note(f"family {family_text(family_fields(cfg.model.family))}")
    ctrl = RunController.open(run, pool, purpose="launch (--no-tui)")
    try:
        if options.grace_s:
            ctrl.grace_s = options.grace_s  # before the launch: torchrun's own shutdown wait follows it
        try:
            ctrl.launch()  # RunLiveError ends the flow (busy, errors.py)
        except LaunchError as err:
            view.note(f"launch failed: {err}")
            return report_outcome(ctrl, ctrl.outcome(), view)
        attempt = ctrl.attempt
        assert attempt is not None  # launch() recorded its attempt
        for line in ctrl.backend.describe(attempt):
            view.note(line)
        return follow_run(ctrl, view, options.grace_s)
    finally:
        ctrl.close()


def _platform(node: PlatformNode, options: FlowOptions, pool: SshPool, view: View) -> ExitCode:
    """A pod/container: launch this node (machine rank = the platform's node index); node 0 also
    records the run's state and reports on every node, the others follow their own node."""
    run, rank = node.run, node.rank
    ctrl = RunController.open(
        run,
        pool,
        purpose=f"platform node {rank}",
        lock_name=None if rank == 0 else f"lock.node-{rank}",
        state=node.state,
    )
    try:
        if options.grace_s:
            ctrl.grace_s = options.grace_s
        resume = None
        if ckpt.scan(run.checkpoints).newest is not None:
            resume = "latest"  # a re-run Job continues where the last one stopped
            view.note("resuming from the newest complete checkpoint")
        try:
            ctrl.launch(resume=resume)
        except LaunchError as err:
            view.note(f"launch failed: {err}")
            return report_outcome(ctrl, ctrl.outcome(), view)
        view.note(
            f"node {rank} of {node.nodes} started (machine rank {rank}, master {node.master_addr}:"
            f"{node.master_port})"
        )
        return follow(ctrl, view, options.grace_s)
    finally:
        ctrl.close()
