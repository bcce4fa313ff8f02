"""`taehv-console attach [RUN]`: pick up a run another console launched (or one whose console was
closed): check its launchers' process trees on every node, then follow it to its end as the
headless front end does. A run that has already ended is reported, not restarted.

Exit status: the headless ExitCode of how the run ends (0 done, 1 failed, 4 stopped, 5 another
console controls it, 2 usage).
"""

from __future__ import annotations

import argparse
import sys

from taehv_console.commands.options import ssh_settings
from taehv_console.commands.status import add_run_arguments
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.runs import newest_unended_run
from taehv_console.core.run.control import RunController
from taehv_console.core.run.lock import RunBusyError
from taehv_console.core.run.rundir import RunNotFoundError
from taehv_console.core.run.state import StateError
from taehv_console.headless import EXIT_CODES_HELP, ExitCode, follow, make_view, report_ended


def register(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "default: the newest running run")
    parser.add_argument("--grace", type=float, metavar="S", help="seconds a stop waits for the checkpoint")
    parser.epilog = EXIT_CODES_HELP


def run(args: argparse.Namespace) -> int:
    try:
        target = newest_unended_run(args.run, args.runs)
    except RunNotFoundError as err:
        print(f"taehv-console attach: {err}", file=sys.stderr)
        return ExitCode.USAGE
    view = make_view(args.json)
    try:
        with SshPool(ssh_settings(args)) as pool:
            try:
                ctrl = RunController.open(target, pool, purpose="attach")
            except RunBusyError as err:
                print(f"taehv-console attach: {err}", file=sys.stderr)
                return ExitCode.BUSY
            except StateError as err:
                print(f"taehv-console attach: {err}", file=sys.stderr)
                return ExitCode.USAGE
            try:
                if ctrl.reconcile() == "live":
                    attempt = ctrl.attempt
                    assert attempt is not None  # a live run has launched an attempt
                    view.note(f"attached to {target.run_id}: " + "; ".join(ctrl.backend.describe(attempt)))
                    return int(follow(ctrl, view, args.grace))
                view.note(f"{target.run_id} is not running")
                return int(report_ended(ctrl, view))
            finally:
                ctrl.close()
    finally:
        view.close()
