"""Entry point of `taehv-console`: parses the command line and hands over to one command module.

Each subcommand lives in `taehv_console.commands.<name>` with `register(parser)` and `run(args) -> int`.
Those modules import nothing heavy at module level, so `taehv-console --help` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Order is the order `--help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "presets": ("taehv_console.commands.presets", "list the shipped and user presets"),
    "plan": ("taehv_console.commands.plan", "communication, time, cost and memory figures for a preset"),
    "render": ("taehv_console.commands.render", "write the launch files (accelerate, DeepSpeed, hostfile, sbatch, k8s)"),
    "detect": ("taehv_console.commands.detect", "detect the cluster: topology source and the facts of every node"),
    "preflight": ("taehv_console.commands.preflight", "check the cluster against a preset before launching"),
    "trust": ("taehv_console.commands.trust", "show a host's SSH key fingerprint and add it to known_hosts"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="taehv-console",
        description="Train TAEHV with DeepSpeed across GPU nodes: detect, check, plan, launch, watch.",
    )
    parser.add_argument("--no-tui", action="store_true", help="run the whole flow headless (containers, CI)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            continue  # a command not built yet is simply not offered
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.register(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help()
        return 2
    return int(run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
