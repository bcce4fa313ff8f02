"""`taehv-console preflight`: check the cluster against a preset before launching; exit 3
(PREFLIGHT_FAILED, as `--no-tui` for the same finding) when an error is found (errors stop a launch,
warnings do not), 2 when the command line or config is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from taehv_console.commands.detect import render_topology
from taehv_console.commands.options import POSITIVE, add_option, add_ssh_options, flow_options
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.config import choose_config
from taehv_console.core.flow.detect import detect
from taehv_console.core.flow.preflight import preflight
from taehv_console.core.models import PreflightReport
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode
from trainer.events import atomic_write_text

EXIT_CODES = {
    ExitCode.DONE: "no errors (warnings allowed): a launch would go ahead",
    ExitCode.USAGE: "wrong command line, hostfile, topology, config or --env",
    ExitCode.PREFLIGHT_FAILED: "errors found: a launch would be refused",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def register(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser, "preset", help="preset to check (default auto: the one picked for the detected cluster)"
    )
    add_option(parser, "hosts")
    add_option(parser, "data", help="data source (sets data.source)")
    add_option(parser, "runs")
    add_option(parser, "overrides", help="override a config value, e.g. optim.batch_per_gpu=4; repeatable")
    add_option(
        parser, "master_port", help="port the run's master will use (default: a free one, as a launch picks)"
    )
    parser.add_argument(
        "--bandwidth",
        action="store_true",
        help="also measure all-reduce bandwidth between the nodes (a few seconds)",
    )
    parser.add_argument(
        "--bandwidth-mb",
        type=POSITIVE,
        default=64.0,
        metavar="MB",
        help="all-reduce buffer size for --bandwidth (default 64)",
    )
    add_option(parser, "json", help="print one JSON object")
    parser.add_argument(
        "--report",
        metavar="FILE",
        help="also write the JSON report to FILE (what an sbatch job's preflight leaves in the run)",
    )
    add_ssh_options(parser)


def run(args: argparse.Namespace) -> ExitCode:
    # a bad hostfile, topology, config or --env: 2, said by cli.main (errors.py)
    options = flow_options(args)
    # detection probes the runs/data paths too, so preflight reuses those probes
    found = detect(options)
    chosen = choose_config(options, found.topology, found.probes)
    say = None if args.json else (lambda msg: print(f"… {msg}", file=sys.stderr))
    with SshPool(options.ssh) as pool:
        result = preflight(
            options,
            found.topology,
            found.probes,
            chosen,
            pool,
            say,
            bandwidth=args.bandwidth,
            bandwidth_megabytes=args.bandwidth_mb,
        )
    report = result.report
    if args.report:
        atomic_write_text(
            Path(args.report),
            json.dumps(
                {**report.to_dict(), "config": result.chosen, "master_port": result.master_port}, indent=2
            )
            + "\n",
        )
    if args.json:
        json.dump(
            {**report.to_dict(), "config": result.chosen, "master_port": result.master_port},
            sys.stdout,
            indent=2,
        )
        print()
    else:
        render(report, result.chosen)
    return ExitCode.DONE if report.ok else ExitCode.PREFLIGHT_FAILED


def render(report: PreflightReport, chosen: str) -> None:
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
