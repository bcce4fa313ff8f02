"""`taehv-console supervise RUN`: the run's supervisor, in the foreground. Consoles start one
detached whenever they launch, resume or attach to a run; run it by hand in a tmux window or a
systemd unit to keep a run supervised from there. It waits while a console controls the run, takes
over when that console goes, and exits with the run's exit code once the run has ended."""

from __future__ import annotations

import argparse
import sys
import time

from taehv_console.commands.options import add_ssh_options, ssh_settings
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.supervisor import Supervisor
from taehv_console.core.run.rundir import RunNotFoundError, resolve_run
from taehv_console.exit_codes import EXIT_CODES_HELP, ExitCode, exit_code_for


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="run directory or id")
    parser.add_argument("--runs", default="runs", metavar="DIR", help="runs directory (default ./runs)")
    add_ssh_options(parser)
    parser.epilog = EXIT_CODES_HELP


def say(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    try:
        target = resolve_run(args.run, args.runs)
    except RunNotFoundError as err:
        print(f"taehv-console supervise: {err}", file=sys.stderr)
        return ExitCode.USAGE
    with SshPool(ssh_settings(args)) as pool:
        outcome = Supervisor(target, pool, say).serve()
    if outcome is None:
        return ExitCode.USAGE
    return int(exit_code_for(outcome.phase, final=outcome.final))
