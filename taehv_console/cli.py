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
    from taehv_console.commands.detect import add_ssh_options
    from taehv_console.headless import EXIT_CODES_HELP, add_launch_options

    add_launch_options(parser)
    add_ssh_options(parser)
    parser.add_argument("--theme", metavar="NAME",
                        help="console colour theme: dark (default), light, high-contrast, or a file's name in "
                             "~/.config/taehv-console/themes/; NO_COLOR is respected")
    parser.epilog = f"--no-tui {EXIT_CODES_HELP}"
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.register(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None)
    if run is None:
        if args.no_tui:
            from taehv_console import headless

            return headless.run(args)
        # the console (Textual) is imported on this path only: --help and subcommands stay light
        from taehv_console.ui.app import run_console

        return run_console(args)
    return int(run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
