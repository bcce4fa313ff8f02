"""`taehv-console supervise RUN`: the run's supervisor, in the foreground. Consoles start one
detached whenever they launch, resume or attach to a run; run it by hand in a tmux window or a
systemd unit to keep a run supervised from there. It waits while a console controls the run, takes
over when that console goes, and exits with the run's exit code once the run has ended (EXIT_CODES)."""

from __future__ import annotations

import argparse
import time

from taehv_console.commands.options import add_option, add_ssh_options, ssh_settings
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.supervisor import Supervisor
from taehv_console.core.run.rundir import resolve_run
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode, exit_code_for

EXIT_CODES = {
    ExitCode.DONE: "the run ended done",
    ExitCode.TRAINING_FAILED: "the run failed; another try may get past it",
    ExitCode.USAGE: "wrong command line, no such run, or the run directory went away",
    ExitCode.STOPPED: "the run was stopped",
    ExitCode.FAILED_FINAL: "the run failed in a way another try would repeat, or its restarts gave up",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C); the run keeps running, unsupervised until a console opens it",
}


def register(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "run", positional=True, required=True, help="run directory or id")
    add_option(parser, "runs")
    add_ssh_options(parser)


def say(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}", flush=True)


def run(args: argparse.Namespace) -> ExitCode:
    target = resolve_run(args.run, args.runs)  # RunNotFoundError: 2, said by cli.main (errors.py)
    with SshPool(ssh_settings(args)) as pool:
        outcome = Supervisor(target, pool, say).serve()
    if outcome is None:
        return ExitCode.USAGE
    return exit_code_for(outcome.phase, final=outcome.final)
