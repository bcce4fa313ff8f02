"""Entry point of `taehv-console`: parses the command line and hands over to one command module,
the headless flow or the TUI. Below this file and commands/ nothing sees an argparse Namespace:
the flow gets a FlowOptions value.

Each subcommand lives in `taehv_console.commands.<name>` with `register(parser)`, `run(args) ->
ExitCode` and `EXIT_CODES` (the codes it can return, listed by its `--help`). An option the top level
and a command share is defined once (commands/options.py: SHARED) and may stand before or after the
command's name.

Imports sit at module top everywhere, except these places, where start-up time or a bare node
needs laziness (`taehv-console --help` must import neither torch nor Textual:
tests/core/test_cli_startup.py; the whole list, with a reason per import, is enforced by
tests/core/test_lazy_imports.py):
- here, `build_parser`: only the chosen subcommand's module is imported (its own imports are at
  its top); `--help` lists the commands from COMMANDS without importing any;
- here, `main`: headless (the whole flow) on the --no-tui path only, the TUI (taehv_console.ui,
  Textual) on the TUI path only;
- ui/screens/preset.py, preflight.py and review.py: the planner and the flow's config, preflight
  and launch modules, which the TUI's first frame does not need;
- core/flow/config.py `generated_clips`: trainer.synthetic (PyAV, numpy) only when clips are made;
- core/cluster/ssh/config.py, hostkeys.py and runners.py: paramiko where ~/.ssh/config is read,
  a host key handled or a connection made;
- core/cluster/probe.py and core/watch/nvml.py: pynvml (a bare node may lack it, and they say so),
  and torch for the NCCL version;
- core/cluster/bandwidth.py and nodecheck.py (node helpers): torch, PyAV, and the trainer's data,
  teacher and cache modules, only in the checks that use them;
- core/watch/tbscalars.py: TensorBoard's reader, only when a logdir is followed;
- commands/eval.py: the trainer's scoring (torch, PyAV) only once `eval` runs, so its `--help`
  stays light;
- trainer/: torch, DeepSpeed and accelerate where training needs them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from collections.abc import Sequence

from taehv_console.commands.options import SPEC, add_top_level_options, flow_options, option_warnings, settle
from taehv_console.core.flow.options import EnvError, FlowOptions
from taehv_console.errors import describe_error
from taehv_console.exit_codes import EXIT_CODES_HELP, ExitCode, command_epilog

# name -> (module, one-line help). Order is the order `--help` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "presets": ("taehv_console.commands.presets", "list the shipped and user presets"),
    "plan": ("taehv_console.commands.plan", "communication, time, cost and memory figures for a preset"),
    "render": (
        "taehv_console.commands.render",
        "write the launch files (accelerate, DeepSpeed, hostfile, sbatch, k8s)",
    ),
    "detect": (
        "taehv_console.commands.detect",
        "detect the cluster: topology source and the facts of every node",
    ),
    "preflight": ("taehv_console.commands.preflight", "check the cluster against a preset before launching"),
    "trust": ("taehv_console.commands.trust", "show a host's SSH key fingerprint and add it to known_hosts"),
    "status": ("taehv_console.commands.status", "a run's phase, nodes, progress and failure; or every run"),
    "stop": ("taehv_console.commands.stop", "stop a run: checkpoint, then nothing of it left on any node"),
    "resume": ("taehv_console.commands.resume", "relaunch a run from its newest complete checkpoint"),
    "attach": ("taehv_console.commands.attach", "follow a run another console launched, until it ends"),
    "supervise": (
        "taehv_console.commands.supervise",
        "keep a run supervised with no console open: take over, restart, notify (started for you)",
    ),
    "eval": (
        "taehv_console.commands.eval",
        "score weights on videos: PSNR, SSIM, flicker, baselines, a contact sheet",
    ),
}


class ConsoleParser(argparse.ArgumentParser):
    """The top-level parser: once a whole line is parsed, the options it shares with the chosen
    command are settled (commands/options.py: one value per option wherever it was given)."""

    commands: dict[str, argparse.ArgumentParser]

    def parse_known_args(  # type: ignore[override]  # argparse's overloads: the first is the one used
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        problem = settle(parsed)
        if problem:  # said by the command's parser (its usage line), exits 2
            (self.commands.get(getattr(parsed, "command", None) or "") or self).error(problem)
        return parsed, extras


def _top_level(add_help: bool = True) -> tuple[ConsoleParser, argparse._SubParsersAction]:
    parser = ConsoleParser(
        prog="taehv-console",
        add_help=add_help,
        description="Train TAEHV with DeepSpeed across GPU nodes: detect, check, plan, launch, watch.",
        epilog=f"--no-tui {EXIT_CODES_HELP}",
    )
    parser.commands = {}
    # the TUI's and the headless flow's options: `taehv-console --no-tui --hosts FILE ...`; a command
    # that shares one takes it before or after its name
    add_top_level_options(parser)
    # the commands' parsers are plain ones: only the top level settles the shared options
    return parser, parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=argparse.ArgumentParser
    )


def chosen_command(argv: list[str]) -> str | None:
    """The subcommand a command line names, as argparse reads it (options' values are skipped)."""
    parser, sub = _top_level(add_help=False)
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    try:
        # argparse's own parse: the commands' options are not registered here, nothing to settle
        return argparse.ArgumentParser.parse_known_args(parser, argv)[0].command
    except SystemExit:
        return None  # a wrong top-level option: the full parse below reports it


def build_parser(command: str | None = None) -> ConsoleParser:
    """The whole command line, with `command`'s own options registered (every command's when
    command is "*", as documentation tools want)."""
    parser, sub = _top_level()
    for name, (module_name, help_text) in COMMANDS.items():
        # raw: the epilog lists the command's exit codes one a line
        p = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        parser.commands[name] = p
        p.set_defaults(**{SPEC: {}})  # the options it shares: none until register adds them
        if command in (name, "*"):
            module = importlib.import_module(module_name)
            module.register(p)
            p.epilog = command_epilog(module.EXIT_CODES)
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
        parser.error(str(err))  # exits with status 2
        raise


def _fd_identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _devnull_identity() -> tuple[int, int] | None:
    try:
        st = os.stat(os.devnull)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def stdout_closed() -> bool:
    """Whether stdout's reader has gone (`| head` read its lines); if so stdout is pointed at
    /dev/null, so that the interpreter's own flush at exit does not report the same broken pipe."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):
        return False  # not a file (a test's capture): nothing that can break
    try:
        sys.stdout.flush()
        # a failed write empties the buffer, so a flush after one may find nothing to write: ask the
        # pipe itself (a write end whose readers are all gone polls as an error)
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        if not any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0)):
            return False
    except BrokenPipeError:
        pass
    except (OSError, ValueError):
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(chosen_command(argv)).parse_args(argv)
    prog = f"taehv-console {args.command}" if getattr(args, "command", None) else "taehv-console"
    for warning in option_warnings(args):  # on stderr: --json's stdout stays JSON
        print(f"{prog}: warning: {warning}", file=sys.stderr)
    stdout_was = _fd_identity(1)
    try:
        code = _dispatch(args)
        stdout_closed()  # its reader went at the end: what was asked is done, so its code stands
        return code
    except SystemExit:
        # rich's Console answers a broken stdout by pointing it at /dev/null and exiting 1, the
        # code platforms retry and `status` uses for a bad checkpoint: say what happened instead
        if stdout_was != _fd_identity(1) == _devnull_identity():
            return int(ExitCode.OUTPUT_CLOSED)
        raise
    except KeyboardInterrupt:
        # a command that follows a run stops it on Ctrl-C itself; elsewhere nothing more is done
        print(f"{prog}: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except BrokenPipeError as err:
        if not stdout_closed():
            code, message = describe_error(err, argv)  # a socket's broken pipe: a node's, say
            print(f"{prog}: {message}", file=sys.stderr)
            return int(code)
        return int(ExitCode.OUTPUT_CLOSED)
    except Exception as err:  # noqa: BLE001 - no traceback reaches a user: a known error is one
        # line with its code (errors.py: ERROR_CODES), anything else one line naming its crash log
        code, message = describe_error(err, argv)
        print(f"{prog}: {message}", file=sys.stderr)
        return int(code)


def _dispatch(args: argparse.Namespace) -> int:
    run = getattr(args, "_run", None)
    if run is not None:
        return int(run(args))
    options = flow_options(args)  # EnvError: a usage error, said by main
    if args.no_tui:
        from taehv_console import headless

        return headless.run(options, json_mode=args.json)
    # the console (Textual) is imported on this path only: --help and subcommands stay light
    from taehv_console.ui.app import run_console

    return run_console(options, theme=args.theme)


if __name__ == "__main__":
    sys.exit(main())
