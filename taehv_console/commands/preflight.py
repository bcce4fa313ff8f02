"""`taehv-console preflight`: check the cluster against a preset before launching; exit 1 when an
error is found (errors stop a launch, warnings do not), 2 when the command line or config is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from taehv_console.commands.detect import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, add_ssh_options, ssh_settings


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="auto", metavar="NAME|PATH|auto",
                        help="preset to check (default auto: the one picked for the detected cluster)")
    parser.add_argument("--hosts", metavar="FILE", help="DeepSpeed hostfile ('host slots=N' per line)")
    parser.add_argument("--data", metavar="DIR", help="data source (sets data.source)")
    parser.add_argument("--runs", metavar="DIR", default="runs", help="runs directory (default ./runs)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. optim.batch_per_gpu=4; repeatable")
    parser.add_argument("--master-port", type=int, metavar="PORT", help="port the run's master will use")
    parser.add_argument("--bandwidth", action="store_true",
                        help="also measure all-reduce bandwidth between the nodes (a few seconds)")
    parser.add_argument("--bandwidth-mb", type=float, default=64.0, metavar="MB",
                        help="all-reduce buffer size for --bandwidth (default 64)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--report", metavar="FILE",
                        help="also write the JSON report to FILE (what an sbatch job's preflight leaves in the run)")
    add_ssh_options(parser)


def choose_config(args: argparse.Namespace, topology: Any, probes: Any) -> tuple[Any, str]:
    """(TrainConfig, how it was chosen) for --preset, --set and --data on this cluster."""
    from taehv_console.core.plan.derive import auto_select
    from taehv_console.core.plan.presets import load_preset

    overrides = list(args.overrides)
    if args.data:
        overrides.append(f"data.source={json.dumps(args.data)}")
    if args.preset != "auto":
        preset = load_preset(args.preset, overrides=overrides)
        return preset.config, f"preset {preset.name} ({preset.path})"
    facts = [p.facts for p in probes if p.facts is not None]
    gpus = [f.visible_gpu_count for f in facts]
    device = "cuda" if facts and all(gpus) else "cpu"
    slots = [n.slots for n in topology.nodes if n.slots]
    if device == "cuda":
        per_node = min(gpus)
        if slots:
            per_node = min(per_node, min(slots))
        if topology.processes_per_node:
            per_node = min(per_node, topology.processes_per_node)
        g = facts[0].visible_gpus[0]
        resolved = auto_select(topology.node_count, per_node, device="cuda", gpu_name=g.name,
                               gpu_memory_gb=round(min(x.memory_gb for f in facts for x in f.visible_gpus)
                                                   * 1.073741824, 1), overrides=overrides)
    else:
        per_node = min(slots) if slots else (topology.processes_per_node or 2)
        resolved = auto_select(topology.node_count, per_node, device="cpu", overrides=overrides)
    return resolved.config, f"auto: {resolved.summary}"


def run(args: argparse.Namespace) -> int:
    from taehv_console.commands.detect import detect
    from taehv_console.core.cluster.hosts import InvalidHostError
    from taehv_console.core.cluster.platform import TopologyError
    from taehv_console.core.cluster.preflight import PreflightOptions, run_preflight
    from taehv_console.core.cluster.ssh import SshPool
    from trainer.config import ConfigError

    try:
        topology, probes = detect(args)  # probes runs/data paths too, so preflight can reuse them
        cfg, chosen = choose_config(args, topology, probes)
    except (TopologyError, InvalidHostError, ConfigError) as err:
        print(f"taehv-console preflight: {err}", file=sys.stderr)
        return EXIT_USAGE
    options = PreflightOptions(runs_dir=args.runs, data_source=cfg.data.source, master_port=args.master_port,
                               bandwidth=args.bandwidth, bandwidth_megabytes=args.bandwidth_mb,
                               assumed_gbps=_assumed_gbps(cfg))
    say = None if args.json else (lambda msg: print(f"… {msg}", file=sys.stderr))
    with SshPool(ssh_settings(args)) as pool:
        report = run_preflight(topology, cfg, pool, options, progress=say, probes=probes)
    if args.report:
        from pathlib import Path

        from trainer.events import atomic_write_text

        atomic_write_text(Path(args.report), json.dumps({**report.to_dict(), "config": chosen}, indent=2) + "\n")
    if args.json:
        json.dump({**report.to_dict(), "config": chosen}, sys.stdout, indent=2)
        print()
    else:
        render(report, chosen)
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _assumed_gbps(cfg: Any) -> float:
    """The inter-node link (Gbit/s) the plan assumed: the preset's `network` note (e.g. '25Gbit'),
    else the planner's default for a multi-node run."""
    from taehv_console.core.plan.planner import INTER_NODE_DEFAULT, parse_bandwidth
    from taehv_console.core.plan.presets import load_preset
    from trainer.config import ConfigError

    try:
        return parse_bandwidth(load_preset(cfg.run.preset).meta.network) / 1e9
    except (ConfigError, ValueError):  # a custom config, or a preset without a network note
        return parse_bandwidth(INTER_NODE_DEFAULT) / 1e9


def render(report: Any, chosen: str) -> None:
    from rich.console import Console

    from taehv_console.commands.detect import render_topology

    # unwrapped when written to a file (an sbatch job's node log): a finding stays one line to grep,
    # and a path is never cut in two
    console = Console(soft_wrap=not sys.stdout.isatty())
    render_topology(console, report.topology)
    console.print(f"[bold]config[/]: {chosen}")
    ok = sum(1 for p in report.probes if p.ok)
    console.print(f"[bold]nodes[/]: {ok} of {len(report.probes)} probed")
    marks = {"error": "[red]✗ error[/]", "warning": "[yellow]! warning[/]", "info": "[dim]· info[/]"}
    for f in report.findings:
        where = f" [bold]{f.node}[/]" if f.node else ""
        message = f.message.removeprefix(f"{f.node}: ") if f.node else f.message  # node shown once
        console.print(f"{marks[f.severity.value]}{where} [dim]({f.id})[/] {message}")
        if f.fix:
            console.print(f"    fix: {f.fix}")
    n_err = len(report.errors)
    n_warn = sum(1 for f in report.findings if f.severity.value == "warning")
    verdict = "[red]errors: a launch would be refused[/]" if n_err else "[green]ready to launch[/]"
    console.print(f"{n_err} error(s), {n_warn} warning(s): {verdict}")

