"""`taehv-console attach [RUN]`: pick up a run another console launched (or one whose console was
closed): follow it to its end as the headless front end does, as the client of the run's
supervisor (or, with none, after checking its launchers' process trees on every node). A run that
has already ended is reported, not restarted.

Exit status: EXIT_CODES below (its `--help` lists them): how the run ends, as for `--no-tui`.
"""

from __future__ import annotations

import argparse
import sys

from taehv_console.commands.options import add_option, ssh_settings
from taehv_console.commands.status import add_run_arguments
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.runs import newest_unended_run
from taehv_console.core.run.client import supervised_client
from taehv_console.core.run.control import RunController
from taehv_console.core.run.outcome import settled
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode
from taehv_console.follow import follow_client, follow_run, make_view, report_ended

EXIT_CODES = {
    ExitCode.DONE: "the run ended done: every rank reached max_steps",
    ExitCode.TRAINING_FAILED: "the run failed (state.json names the node and rank); another try may get past it",
    ExitCode.USAGE: "wrong command line, no such run (no running run without RUN), or a damaged run (its state.json or run.toml)",
    ExitCode.STOPPED: "the run was stopped (Ctrl-C, a signal or `taehv-console stop`); resume it",
    ExitCode.BUSY: "another console controls the run",
    ExitCode.FAILED_FINAL: "the run failed in a way another try would repeat, or its restarts gave up: do not retry",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C) before the run was being followed; it keeps running",
}


def register(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "default: the newest running run")
    add_option(parser, "grace")


def run(args: argparse.Namespace) -> ExitCode:
    # no such run, a damaged run (named by file and field) 2, a busy run 5: cli.main says them
    # (errors.py)
    target = newest_unended_run(
        args.run, args.runs, on_skip=lambda note: print(f"taehv-console attach: {note}", file=sys.stderr)
    )
    view = make_view(args.json)
    try:
        with SshPool(ssh_settings(args)) as pool:
            client = supervised_client(target, pool)
            if client is not None and not client.settled():
                client.grace_s = args.grace or None
                view.note(
                    f"attached to {target.run_id} (its supervisor controls it): "
                    + "; ".join(client.describe())
                )
                return follow_client(client, view)
            ctrl = RunController.open(target, pool, purpose="attach")
            try:
                # a failure nobody judged yet, a restart's backoff: following carries the run on
                if ctrl.reconcile() == "live" or not settled(ctrl.state):
                    attempt = ctrl.attempt
                    assert attempt is not None  # a live run has launched an attempt
                    view.note(f"attached to {target.run_id}: " + "; ".join(ctrl.backend.describe(attempt)))
                    return follow_run(ctrl, view, args.grace)
                view.note(f"{target.run_id} is not running")
                return report_ended(ctrl, view)
            finally:
                ctrl.close()
    finally:
        view.close()
