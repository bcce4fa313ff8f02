"""`taehv-console resume [RUN]`: relaunch a stopped or failed run from its newest complete
checkpoint (docs/design.md's protocol: never a .tmp or unverified one), then follow it to its end.

Refused while the run is alive (attach instead) or controlled by another console. When the world
size changed since the checkpoint, nothing starts: the message gives the supported paths
(weights-only with a fresh optimizer, or DeepSpeed's universal checkpoint conversion).

Exit status: EXIT_CODES below (its `--help` lists them): how the run ends, as for `--no-tui`.
"""

from __future__ import annotations

import argparse
import dataclasses

from taehv_console.commands.options import add_option, ssh_settings
from taehv_console.commands.status import add_run_arguments
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.options import parse_env
from taehv_console.core.run import supervision
from taehv_console.core.run.client import RunClient, client_mode
from taehv_console.core.run.control import RunController
from taehv_console.core.run.outcome import (
    AllocationTooSmallError,
    LaunchError,
    RunLiveError,
    settled,
)
from taehv_console.core.run.rundir import resolve_run
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode
from taehv_console.follow import follow_run, make_view, report_outcome

EXIT_CODES = {
    ExitCode.DONE: "the run ended done (with --detach: every node started)",
    ExitCode.TRAINING_FAILED: "the run failed (state.json names the node and rank); another try may get past it",
    ExitCode.USAGE: "wrong command line or --env, no such run, a damaged run (its state.json or run.toml), "
    "nothing to resume from, the world size changed, or the SLURM allocation has fewer nodes than the run",
    ExitCode.STOPPED: "the run was stopped (Ctrl-C, a signal or `taehv-console stop`); resume it",
    ExitCode.BUSY: "the run is running (attach instead) or another console controls it",
    ExitCode.FAILED_FINAL: "the run failed in a way another try would repeat, or its restarts gave up: do not retry",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C) before the run was being followed; it keeps running",
}


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
    add_option(
        parser,
        "launch_env",
        help="environment for every node's launcher (added to the run's; KEY= clears one)",
    )
    add_option(parser, "grace")
    parser.add_argument(
        "--detach",
        action="store_true",
        help="return once every node has started (attach later); the run's supervisor keeps it "
        "(with TAEHV_SUPERVISOR=off, failures are noticed only when a console is attached)",
    )


def run(args: argparse.Namespace) -> ExitCode:
    # a refusal is an error of its own class, raised where it is found; cli.main says it and maps
    # it to its code (errors.py: no such run, a damaged run, nothing to resume 2; a live run 5)
    target = resolve_run(args.run, args.runs)
    extra_env = parse_env(args.launch_env)
    view = make_view(args.json)
    try:
        with SshPool(ssh_settings(args)) as pool:
            if supervision.running_supervisor(target) is not None and not settled(target.read_state()):
                raise RunLiveError(
                    f"{target.run_id} is running under its supervisor: a resume would start it "
                    f"twice; attach to it instead (taehv-console attach {target.run_id})"
                )
            ctrl = RunController.open(target, pool, purpose="resume")
            try:
                if ctrl.reconcile() == "live":
                    raise RunLiveError(
                        f"{target.run_id} is running: a resume would start it twice; "
                        f"attach to it instead (taehv-console attach {target.run_id})"
                    )
                point = ctrl.resume_point(weights_only=args.weights_only, from_path=args.from_path)
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
                    # RunLiveError (busy) and AllocationTooSmallError (usage) end it through cli.main
                    ctrl.launch(resume=point.spec, weights_only=args.weights_only)
                except (RunLiveError, AllocationTooSmallError):
                    raise
                except LaunchError as err:
                    view.note(f"launch failed: {err}")
                    return report_outcome(ctrl, ctrl.outcome(), view)
                if args.detach:
                    if client_mode(ctrl.kind):
                        RunClient.hand_over(ctrl)  # its supervisor keeps it from here
                    view.note(f"started; follow it with: taehv-console attach {target.path}")
                    return ExitCode.DONE
                return follow_run(ctrl, view, args.grace)
            finally:
                ctrl.close()
    finally:
        view.close()
