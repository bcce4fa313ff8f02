"""Runs on a rank's node: the forensics a console cannot do from afar. `python -m
taehv_console.core.forensics.node pyspy|selfdump|fr-dump|ras ...`, each printing one JSON object; the
console calls `node_command` in-process for this machine and over SSH for the others.

Every reply is a dict with "kind" (ok, or why not) and "error" (text for a person), so the console
has one way to read any of them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence

from taehv_console.core.cluster.ssh import NodeRunner
from taehv_console.core.forensics import flight_recorder, pyspy, ras, selfdump

NODE_MODULE = "taehv_console.core.forensics.node"
UNREACHABLE = "unreachable"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m {NODE_MODULE}")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("pyspy", help="dump one process's Python stack with py-spy")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--timeout", type=float, default=pyspy.DUMP_TIMEOUT_S)
    p = sub.add_parser("selfdump", help="ask a rank for its own stack dump (faulthandler) and read it")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--file", required=True, help="the rank's stacks/rank-<r>.txt")
    p.add_argument("--timeout", type=float, default=selfdump.DUMP_TIMEOUT_S)
    p = sub.add_parser(
        "fr-dump", help="trigger Flight Recorder dumps through ranks' pipes and copy them away"
    )
    p.add_argument("--pipe-stem", required=True, help="TORCH_NCCL_DEBUG_INFO_PIPE_FILE of the run")
    p.add_argument("--trace-stem", required=True, help="TORCH_NCCL_DEBUG_INFO_TEMP_FILE of the run")
    p.add_argument("--rank", type=int, action="append", required=True)
    p.add_argument("--dest", required=True, help="directory the dumps are copied into")
    p.add_argument("--timeout", type=float, default=flight_recorder.DUMP_WAIT_S)
    p = sub.add_parser("ras", help="ask this node's NCCL RAS service for its verbose status")
    p.add_argument(
        "--pid", type=int, required=True, help="a rank process on this node (its NCCL version decides)"
    )
    p.add_argument("--port", type=int, default=ras.RAS_PORT)
    p.add_argument("--timeout", type=float, default=ras.QUERY_TIMEOUT_S)
    return parser


def run_action(args: argparse.Namespace) -> dict:
    """The node-side work as a function (in-process for this machine, safe from many threads)."""
    if args.action == "pyspy":
        return pyspy.dump_process(args.pid, python=sys.executable, timeout=args.timeout)
    if args.action == "selfdump":
        return selfdump.dump_by_signal(args.pid, args.file, timeout=args.timeout)
    if args.action == "fr-dump":
        return flight_recorder.dump_through_pipes(
            args.pipe_stem, args.trace_stem, args.rank, args.dest, timeout=args.timeout
        )
    return ras.query_for(args.pid, port=args.port, timeout=args.timeout)


def node_command(runner: NodeRunner, args: Sequence[str], *, timeout: float = 60.0) -> dict:
    """Run one forensics action on the runner's node and return its reply (in-process for this
    machine, without starting a Python per call). A node that cannot be reached, or whose helper
    fails, gives {"kind": "unreachable", "error": ...}: never raises."""
    reply = runner.call(
        NODE_MODULE,
        args,
        timeout=timeout,
        require=("kind",),
        in_process=lambda a: run_action(build_parser().parse_args(a)),
    )
    if reply.error is not None:
        return {"kind": UNREACHABLE, "error": reply.error.with_fix()}
    return dict(reply.data)


def main(argv: Iterable[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    out = run_action(args)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
