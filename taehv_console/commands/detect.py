"""`taehv-console detect`: which topology source applies and the facts of every node."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from taehv_console.commands.options import add_option, add_ssh_options, flow_options
from taehv_console.core.flow.detect import detect
from taehv_console.core.models import NodeFacts, ProbeResult, Topology
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode

EXIT_CODES = {
    ExitCode.DONE: "every node answered",
    ExitCode.FAILED: "a node's probe failed (unreachable, or it could not report)",
    ExitCode.USAGE: "wrong command line, hostfile, host name or topology",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def register(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "hosts")
    # no default: without --runs no runs directory is checked
    add_option(parser, "runs", default=None, help="runs directory: also report its free space on every node")
    add_option(parser, "data", help="data source: also check it on every node")
    add_option(parser, "json", help="print one JSON object")
    add_ssh_options(parser)


def run(args: argparse.Namespace) -> ExitCode:
    options = dataclasses.replace(flow_options(args), runs=args.runs or "")  # no --runs: no runs path checked
    found = detect(options)  # a bad hostfile or topology: 2, said by cli.main (errors.py)
    topology, probes = found.topology, found.probes
    if args.json:
        json.dump(
            {
                "ok": all(p.ok for p in probes),
                "topology": topology.to_dict(),
                "nodes": [p.to_dict() for p in probes],
            },
            sys.stdout,
            indent=2,
        )
        print()
    else:
        render(topology, probes)
    return ExitCode.DONE if all(p.ok for p in probes) else ExitCode.FAILED


def gpu_summary(facts: NodeFacts) -> str:
    if not facts.visible_gpu_count:
        return "0"
    names: dict[str, int] = {}
    for g in facts.visible_gpus:
        key = f"{g.name} {g.memory_gb:.0f}G"
        names[key] = names.get(key, 0) + 1
    text = ", ".join(f"{n}× {k}" for k, n in names.items())
    if facts.visible_gpu_count != facts.gpu_count:
        text += f" (of {facts.gpu_count})"
    return text


def render_topology(console: Console, topology: Topology) -> None:
    console.print(f"[bold]topology[/]: {topology.source.value} — {topology.detail}")
    console.print(
        f"  nodes {topology.node_count}, master {topology.master_addr}:{topology.master_port}"
        + (f", this node's rank {topology.this_node_rank}" if topology.this_node_rank is not None else "")
        + (f", {topology.processes_per_node} processes per node" if topology.processes_per_node else "")
    )
    for note in topology.notes:
        console.print(f"  [yellow]note[/]: {note}")


def render(topology: Topology, probes: Sequence[ProbeResult]) -> None:
    console = Console()
    render_topology(console, topology)
    slots = {n.host: n.slots for n in topology.nodes}
    # Few, short columns: this must stay readable in an 80-column tmux pane; details go below.
    table = Table(pad_edge=False, box=None, header_style="bold")
    for col in ("node", "slots", "GPUs", "driver/CUDA", "CPU/RAM", "torch·ds·acc", "probe"):
        table.add_column(col)
    for p in probes:
        f = p.facts
        if f is None:  # not p.ok
            table.add_row(
                f"[red]{p.host}[/]",
                str(slots.get(p.host) or "-"),
                "[red]unreachable[/]",
                "",
                "",
                "",
                f"{p.seconds:.2f}s",
            )
            continue
        table.add_row(
            p.host,
            str(slots.get(p.host) or "-"),
            gpu_summary(f),
            f"{f.driver_version or '-'}/{f.cuda_driver_version or '-'}",
            f"{f.cpu_count}/{f.ram_gb:.0f}G",
            " · ".join(
                v or "[red]none[/]" for v in (f.torch_version, f.deepspeed_version, f.accelerate_version)
            ),
            f"{p.seconds:.2f}s",
        )
    console.print(table)
    for p in probes:
        f = p.facts
        if f is None:  # not p.ok
            console.print(f"[red]{p.host}[/]: {p.error}" + (f"\n  fix: {p.fix}" if p.fix else ""))
            continue
        extra = [
            f"hostname {f.hostname}",
            f"Python {f.python_version}",
            f"NCCL {f.nccl_version}" if f.nccl_version else f"NCCL - ({f.nccl_reason})",
            f"IB {','.join(f.ib_devices)}" if f.ib_devices else "no InfiniBand",
        ]
        if not f.visible_gpu_count:
            extra.append(f"0 GPUs: {f.gpu_reason or 'none visible'}")
        if f.invalid_visible_entries:
            extra.append(f"[red]CUDA_VISIBLE_DEVICES={f.cuda_visible_devices} names missing GPUs[/]")
        if p.clock_offset_s:
            extra.append(f"clock {p.clock_offset_s:+.1f}s")
        for path in f.paths:
            state = (
                "missing"
                if not path.exists
                else "unreadable"
                if not path.readable
                else "not a directory"
                if path.label == "runs" and not path.is_dir
                else "not writable"
                if path.label == "runs" and not path.writable
                else "ok"
            )
            free = f", {path.free_gb:.0f} GB free" if path.free_gb is not None else ""
            extra.append(f"{path.label} {path.path} ({state}{free})")
        console.print(f"[bold]{p.host}[/]: " + "; ".join(extra))
