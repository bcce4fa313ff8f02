"""`taehv-console render`: write the launch files of a preset (or a derived config) into a folder.

Imports nothing heavy (torch, Textual): `taehv-console --help` imports this module.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from taehv_console.commands.options import COUNT, PORT, POSITIVE, add_option
from taehv_console.core.cluster.hosts import HostfileError, read_hostfile
from taehv_console.core.plan.derive import resolve_config
from taehv_console.core.plan.render import RenderOptions, write_launch_files
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode

EXIT_CODES = {
    ExitCode.DONE: "the files were written",
    ExitCode.USAGE: "wrong command line, config, value or hostfile, or the folder cannot be written",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def register(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "preset", required=True, help="preset name or .toml path ('auto' with a topology)")
    parser.add_argument("--out", required=True, help="folder to write the files into (created if needed)")
    parser.add_argument("--nodes", type=COUNT, help="machines taking part (derive for this topology)")
    parser.add_argument("--gpus-per-node", type=COUNT, help="GPUs (training processes) per machine")
    parser.add_argument("--gpu", default="", help="GPU model for --preset auto, e.g. H100")
    parser.add_argument("--gpu-memory-gb", type=POSITIVE, help="memory per GPU, GB")
    add_option(parser, "hosts", help="DeepSpeed hostfile ('host slots=N' per line): the nodes, node 0 first")
    parser.add_argument("--run-dir", help="the folder's path as the nodes see it (default: --out, absolute)")
    parser.add_argument("--main-ip", default="", help="address of node 0 (default: first host)")
    parser.add_argument("--port", type=PORT, default=29500, help="rendezvous port on node 0 (29500)")
    parser.add_argument(
        "--image", default="taehv-console:latest", help="container image for the Kubernetes Job"
    )
    add_option(parser, "overrides", help="override a config value, e.g. optim.lr=2e-4; repeatable")
    add_option(parser, "json", help="print what was written as JSON")


def run(args: argparse.Namespace) -> ExitCode:
    try:
        return _run(args)
    except OSError as err:
        print(f"error: cannot write to {args.out}: {err.strerror or err}", file=sys.stderr)
        return ExitCode.USAGE


def _run(args: argparse.Namespace) -> ExitCode:
    hosts: tuple[str, ...] = ()
    nodes, gpus = args.nodes, args.gpus_per_node
    if args.hosts:
        entries = read_hostfile(args.hosts)  # validated names: nothing reaches a file or shell unchecked
        hosts = tuple(e.host for e in entries)
        slots = {e.slots for e in entries if e.slots is not None}
        if nodes is None and gpus is None:
            # the hostfile is the topology: one node per line, its slots the processes per node
            if len(slots) > 1:
                raise HostfileError(
                    f"{args.hosts}: nodes have different slot counts {sorted(slots)}; every node must run "
                    "the same number of processes (give --gpus-per-node to use fewer on each)"
                )
            if slots:
                nodes, gpus = len(hosts), slots.pop()
    resolved = resolve_config(
        args.preset,
        nodes=nodes,
        gpus_per_node=gpus,
        gpu_name=args.gpu,
        gpu_memory_gb=args.gpu_memory_gb,
        overrides=args.overrides,
    )
    cfg = resolved.config
    if hosts and len(hosts) != cfg.topology.nodes:
        raise HostfileError(
            f"{args.hosts} names {len(hosts)} host(s) but the config has {cfg.topology.nodes} node(s); "
            "give one host per node, or --nodes/--gpus-per-node to match the hostfile"
        )
    out = Path(args.out)
    opts = RenderOptions(
        run_dir=args.run_dir or str(out.resolve()),
        hosts=hosts,
        main_process_ip=args.main_ip,
        main_process_port=args.port,
        image=args.image,
    )
    written = write_launch_files(cfg, out, opts)
    placeholders = opts.placeholders(cfg.topology.nodes)
    if args.json:
        print(
            json.dumps(
                {
                    "summary": resolved.summary,
                    "derived": resolved.derived,
                    "preset": cfg.run.preset,
                    "run_dir": opts.run_dir,
                    "files": [str(p) for p in written],
                    "placeholder_hosts": placeholders,
                    "reasons": [
                        {"key": r.key, "value": r.value, "reason": r.reason} for r in resolved.reasons
                    ],
                },
                indent=2,
                default=str,
            )
        )
    else:
        t = cfg.topology
        print(f"{resolved.summary}: {t.nodes} node(s) x {t.gpus_per_node} = {t.world_size} processes")
        # a derived config's values, or a preset's clip fitted to a family set with --set
        for r in resolved.reasons if resolved.derived else resolved.reasons[1:]:
            print(f"  {r.key} = {r.value}: {r.reason}")
        print(f"wrote {len(written)} files to {out}:")
        for p in written:
            print(f"  {p.name}")
    if placeholders:
        print(
            "warning: no --hosts given for a multi-node config: the hostfile and main_process_ip use "
            "placeholders node-0 ...; render again with --hosts FILE",
            file=sys.stderr,
        )
    return ExitCode.DONE
