"""`taehv-console resume [RUN]`: relaunch a stopped or failed run from its newest complete
checkpoint (docs/design.md's protocol: never a .tmp or unverified one), then follow it to its end.

Refused while the run is alive (attach instead) or controlled by another console. When the world
size changed since the checkpoint, nothing starts: the message gives the supported paths
(weights-only with a fresh optimizer, or DeepSpeed's universal checkpoint conversion).

Exit status: the headless ExitCode (0 done, 1 failed, 2 usage or nothing to resume, 4 stopped,
5 busy: running or controlled elsewhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from taehv_console.commands.options import ssh_settings
from taehv_console.commands.status import add_run_arguments
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.options import EnvError, parse_env
from taehv_console.core.run.control import RunController
from taehv_console.core.run.lock import RunBusyError
from taehv_console.core.run.outcome import (
    LaunchError,
    NothingToResumeError,
    RunLiveError,
    WorldSizeChangedError,
)
from taehv_console.core.run.rundir import RunNotFoundError, resolve_run
from taehv_console.core.run.state import StateError
from taehv_console.headless import EXIT_CODES_HELP, ExitCode, follow, make_view, report_outcome


def register(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "default: the newest run")
    parser.add_argument(
        "--weights-only",
        action="store_true",
        help="load the checkpoint's weights with a fresh optimizer (e.g. at another world size)",
    )
    parser.add_argument(
        "--from",
        dest="from_path",
        metavar="CHECKPOINT",
        help="a checkpoint directory instead of the newest complete one",
    )
    parser.add_argument(
        "--env",
        dest="launch_env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment for every node's launcher (added to the run's; KEY= clears one)",
    )
    parser.add_argument("--grace", type=float, metavar="S", help="seconds a stop waits for the checkpoint")
    parser.add_argument(
        "--detach",
        action="store_true",
        help="return once every node has started (attach later); failures are then noticed "
        "only when a console is attached",
    )
    parser.epilog = EXIT_CODES_HELP


def run(args: argparse.Namespace) -> int:
    def fail(code: ExitCode, message: str) -> int:
        print(f"taehv-console resume: {message}", file=sys.stderr)
        return int(code)

    try:
        target = resolve_run(args.run, args.runs)
        extra_env = parse_env(args.launch_env)
    except (RunNotFoundError, EnvError) as err:
        return fail(ExitCode.USAGE, str(err))
    view = make_view(args.json)
    try:
        with SshPool(ssh_settings(args)) as pool:
            try:
                ctrl = RunController.open(target, pool, purpose="resume")
            except RunBusyError as err:
                return fail(ExitCode.BUSY, str(err))
            except StateError as err:
                return fail(ExitCode.USAGE, str(err))
            try:
                if ctrl.reconcile() == "live":
                    return fail(
                        ExitCode.BUSY,
                        f"{target.run_id} is running: a resume would start it twice; "
                        f"attach to it instead (taehv-console attach {target.run_id})",
                    )
                try:
                    point = ctrl.resume_point(weights_only=args.weights_only, from_path=args.from_path)
                except (NothingToResumeError, WorldSizeChangedError) as err:
                    return fail(ExitCode.USAGE, str(err))
                if extra_env:
                    env = dict(ctrl.state.env)
                    env.update(extra_env)
                    ctrl._save(
                        dataclasses.replace(
                            ctrl.state, env=tuple(sorted((k, v) for k, v in env.items() if v != ""))
                        )
                    )
                if args.grace:
                    ctrl.grace_s = args.grace
                for s in point.skipped:
                    view.note(f"not resuming from {s}")
                view.note(
                    f"resuming {target.run_id} from {point.path} (step {point.step})"
                    + (", weights only" if args.weights_only else "")
                )
                try:
                    ctrl.launch(resume=point.spec, weights_only=args.weights_only)
                except RunLiveError as err:
                    return fail(ExitCode.BUSY, str(err))
                except LaunchError as err:
                    view.note(f"launch failed: {err}")
                    return int(report_outcome(ctrl, ctrl.outcome(), view))
                if args.detach:
                    view.note(f"started; follow it with: taehv-console attach {target.path}")
                    return int(ExitCode.DONE)
                return int(follow(ctrl, view, args.grace))
            finally:
                ctrl.close()
    finally:
        view.close()
