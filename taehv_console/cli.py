"""Entry point of `taehv-console`: parses the command line and hands over to one command module,
the headless flow or the TUI. Below this file (and commands/) nothing sees an argparse Namespace:
the flow gets a FlowOptions value.

Each subcommand lives in `taehv_console.commands.<name>` with `register(parser)` and `run(args) -> int`.

Imports are at module top everywhere, except these places, where start-up time needs laziness
(`taehv-console --help` must import neither torch nor Textual; tests/core/test_cli_startup.py):
- cli.py `main`: the TUI (`taehv_console.ui.app`, Textual) on the TUI path only;
- core/flow/config.py `generated_clips`: trainer.synthetic (PyAV, numpy) when clips are made;
- trainer/: torch, DeepSpeed and accelerate are imported where training needs them, never by the
  console's own modules;
- core/cluster/ssh.py: paramiko where a connection is opened (the agent and node helpers run
  without it).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from taehv_console import headless
from taehv_console.commands.options import add_launch_options, add_ssh_options, flow_options
from taehv_console.core.flow import EnvError, FlowOptions

# name -> (module, one-line help). Order is the order `--help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "presets": ("taehv_console.commands.presets", "list the shipped and user presets"),
    "plan": ("taehv_console.commands.plan", "communication, time, cost and memory figures for a preset"),
    "render": ("taehv_console.commands.render", "write the launch files (accelerate, DeepSpeed, hostfile, sbatch, k8s)"),
    "detect": ("taehv_console.commands.detect", "detect the cluster: topology source and the facts of every node"),
    "preflight": ("taehv_console.commands.preflight", "check the cluster against a preset before launching"),
    "trust": ("taehv_console.commands.trust", "show a host's SSH key fingerprint and add it to known_hosts"),
    "status": ("taehv_console.commands.status", "a run's phase, nodes, progress and failure; or every run"),
    "stop": ("taehv_console.commands.stop", "stop a run: checkpoint, then nothing of it left on any node"),
    "resume": ("taehv_console.commands.resume", "relaunch a run from its newest complete checkpoint"),
    "attach": ("taehv_console.commands.attach", "follow a run another console launched, until it ends"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="taehv-console",
        description="Train TAEHV with DeepSpeed across GPU nodes: detect, check, plan, launch, watch.",
    )
    parser.add_argument("--no-tui", action="store_true",
                        help="run the whole flow headless (containers, CI): detect, preflight, launch or attach, "
                             "progress until the run ends")
    # the headless flow's options live on the top level: `taehv-console --no-tui --hosts FILE ...`
    add_launch_options(parser)
    add_ssh_options(parser)
    parser.add_argument("--theme", metavar="NAME",
                        help="console colour theme: dark (default), light, high-contrast, or a file's name in "
                             "~/.config/taehv-console/themes/; NO_COLOR is respected")
    parser.epilog = f"--no-tui {headless.EXIT_CODES_HELP}"
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.register(p)
        p.set_defaults(_run=module.run)
    return parser


def console_options(argv: list[str]) -> tuple[FlowOptions, str | None]:
    """The flow's options and the theme of a `taehv-console [options]` command line (the TUI's
    and tests' way in). SystemExit for a wrong command line, as argparse does."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return flow_options(args), args.theme
    except EnvError as err:
        parser.error(str(err))
        raise  # parser.error exits; this line keeps type checkers honest


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None)
    if run is not None:
        return int(run(args) or 0)
    try:
        options = flow_options(args)
    except EnvError as err:
        print(f"taehv-console: {err}", file=sys.stderr)
        return int(headless.ExitCode.USAGE)
    if args.no_tui:
        return headless.run(options, json_mode=args.json)
    # the console (Textual) is imported on this path only: --help and subcommands stay light
    from taehv_console.ui.app import run_console

    return run_console(options, theme=args.theme)


if __name__ == "__main__":
    sys.exit(main())
