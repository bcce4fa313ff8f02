"""`taehv-console detect`: which topology source applies and the facts of every node.

Also home of the SSH options `preflight` and `trust` share. Nothing heavy is imported at module
level: `taehv-console --help` imports this file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def add_ssh_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("SSH")
    g.add_argument("--ssh-config", metavar="FILE", help="ssh client config (default ~/.ssh/config, $TAEHV_SSH_CONFIG)")
    g.add_argument("--known-hosts", metavar="FILE",
                   help="known_hosts file (default ~/.ssh/known_hosts, $TAEHV_KNOWN_HOSTS)")
    g.add_argument("--python", metavar="PATH",
                   help="the nodes' python with taehv-console installed (default: this console's, "
                        "$TAEHV_REMOTE_PYTHON)")
    g.add_argument("--connect-timeout", type=float, metavar="S", help="seconds to connect to a node (default 10)")
    g.add_argument("--parallel", type=int, metavar="N", help="nodes contacted at once (default 64)")


def ssh_settings(args: argparse.Namespace):
    from taehv_console.core.cluster.ssh import SshSettings

    return SshSettings.from_env(
        config_path=getattr(args, "ssh_config", None), known_hosts_path=getattr(args, "known_hosts", None),
        python=getattr(args, "python", None), connect_timeout_s=getattr(args, "connect_timeout", None),
        max_parallel=getattr(args, "parallel", None),
    )


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hosts", metavar="FILE", help="DeepSpeed hostfile ('host slots=N' per line)")
    parser.add_argument("--runs", metavar="DIR", help="also report free space where runs are written")
    parser.add_argument("--data", metavar="DIR", help="also check the data source on every node")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_ssh_options(parser)


def detect(args: argparse.Namespace):
    """(topology, probe results) for the command line's hosts/env; raises TopologyError."""
    from taehv_console.core.cluster.gather import node_path, probe_hosts
    from taehv_console.core.cluster.platform import detect_topology
    from taehv_console.core.cluster.probe import probe_node
    from taehv_console.core.cluster.ssh import SshPool
    from taehv_console.core.models import ProbeResult

    settings = ssh_settings(args)
    paths = {k: node_path(v) for k, v in (("runs", getattr(args, "runs", None)),
                                          ("data", getattr(args, "data", None))) if v}
    if args.hosts:
        topology = detect_topology(os.environ, args.hosts)
        with SshPool(settings) as pool:
            return topology, probe_hosts(topology.hosts, pool, paths)
    # This machine is probed in-process: no subprocess, and its clock is ours by definition.
    facts = probe_node(paths)
    local = ProbeResult(host="localhost", facts=facts, seconds=facts.probe_seconds, clock_offset_s=0.0)
    return detect_topology(os.environ, None, local_gpus=facts.visible_gpu_count or None), (local,)


def run(args: argparse.Namespace) -> int:
    from taehv_console.core.cluster.hosts import InvalidHostError
    from taehv_console.core.cluster.platform import TopologyError

    try:
        topology, probes = detect(args)
    except (TopologyError, InvalidHostError) as err:
        print(f"taehv-console detect: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        json.dump({"ok": all(p.ok for p in probes), "topology": topology.to_dict(),
                   "nodes": [p.to_dict() for p in probes]}, sys.stdout, indent=2)
        print()
    else:
        render(topology, probes)
    return EXIT_OK if all(p.ok for p in probes) else EXIT_FINDINGS


def gpu_summary(facts: Any) -> str:
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


def render_topology(console: Any, topology: Any) -> None:
    console.print(f"[bold]topology[/]: {topology.source.value} — {topology.detail}")
    console.print(f"  nodes {topology.node_count}, master {topology.master_addr}:{topology.master_port}"
                  + (f", this node's rank {topology.this_node_rank}" if topology.this_node_rank is not None else "")
                  + (f", {topology.processes_per_node} processes per node" if topology.processes_per_node else ""))
    for note in topology.notes:
        console.print(f"  [yellow]note[/]: {note}")


def render(topology: Any, probes: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    render_topology(console, topology)
    slots = {n.host: n.slots for n in topology.nodes}
    # Few, short columns: this must stay readable in an 80-column tmux pane; details go below.
    table = Table(pad_edge=False, box=None, header_style="bold")
    for col in ("node", "slots", "GPUs", "driver/CUDA", "CPU/RAM", "torch·ds·acc", "probe"):
        table.add_column(col)
    for p in probes:
        if not p.ok:
            table.add_row(f"[red]{p.host}[/]", str(slots.get(p.host) or "-"), "[red]unreachable[/]",
                          "", "", "", f"{p.seconds:.2f}s")
            continue
        f = p.facts
        table.add_row(
            p.host, str(slots.get(p.host) or "-"), gpu_summary(f),
            f"{f.driver_version or '-'}/{f.cuda_driver_version or '-'}", f"{f.cpu_count}/{f.ram_gb:.0f}G",
            " · ".join(v or "[red]none[/]" for v in (f.torch_version, f.deepspeed_version, f.accelerate_version)),
            f"{p.seconds:.2f}s",
        )
    console.print(table)
    for p in probes:
        if not p.ok:
            console.print(f"[red]{p.host}[/]: {p.error}" + (f"\n  fix: {p.fix}" if p.fix else ""))
            continue
        f = p.facts
        extra = [f"hostname {f.hostname}", f"Python {f.python_version}",
                 f"NCCL {f.nccl_version}" if f.nccl_version else f"NCCL - ({f.nccl_reason})",
                 f"IB {','.join(f.ib_devices)}" if f.ib_devices else "no InfiniBand"]
        if not f.visible_gpu_count:
            extra.append(f"0 GPUs: {f.gpu_reason or 'none visible'}")
        if f.invalid_visible_entries:
            extra.append(f"[red]CUDA_VISIBLE_DEVICES={f.cuda_visible_devices} names missing GPUs[/]")
        if p.clock_offset_s:
            extra.append(f"clock {p.clock_offset_s:+.1f}s")
        for path in f.paths:
            state = "ok" if path.exists and path.readable else "missing" if not path.exists else "unreadable"
            free = f", {path.free_gb:.0f} GB free" if path.free_gb is not None else ""
            extra.append(f"{path.label} {path.path} ({state}{free})")
        console.print(f"[bold]{p.host}[/]: " + "; ".join(extra))
