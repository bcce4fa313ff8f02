"""`taehv-console stop [RUN]`: SIGTERM every node's launcher group, wait for the checkpoint and the
ranks' `stop` events, SIGKILL what is left, and check nothing of the run remains on any node.
When the run's supervisor (or another console) controls the run, it is asked to do it
(RUN/stop.request) and watched until done.

Exit status: EXIT_CODES below (its `--help` lists them).
"""

from __future__ import annotations

import argparse
import json
import sys

from taehv_console.commands.options import add_option, ssh_settings
from taehv_console.commands.status import add_run_arguments
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.runs import newest_unended_run
from taehv_console.core.run.requests import request_stop
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode
from taehv_console.follow import make_view

EXIT_CODES = {
    ExitCode.DONE: "stopped (or it had already ended), and nothing of it is left on any node",
    ExitCode.FAILED: (
        "something of it could not be stopped, its controlling console did not stop it, or a recorded "
        "process could not be proven the run's (it was sent no signal; state.json's attention names it)"
    ),
    ExitCode.USAGE: "wrong command line, no such run (no running run without RUN), or a damaged run (its state.json or run.toml)",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C) while waiting; the stop may still go on",
}


def register(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "default: the newest running run")
    add_option(parser, "grace")


def run(args: argparse.Namespace) -> ExitCode:
    # no such run, a damaged run (named by file and field; nothing signalled) 2, a stop that could
    # not be carried out (ControlError) 1: cli.main says them (errors.py)
    target = newest_unended_run(
        args.run, args.runs, on_skip=lambda note: print(f"taehv-console stop: {note}", file=sys.stderr)
    )
    view = make_view(args.json)
    try:
        with SshPool(ssh_settings(args)) as pool:
            state = request_stop(target, pool, grace_s=args.grace, on_update=view.update, say=view.note)
    finally:
        view.close()
    s = state.stop
    ok = state.phase.ended and (s is None or s.verified)
    result = {
        "run": target.run_id,
        "phase": state.phase.value,
        "checkpoint_step": s.checkpoint_step if s else None,
        "nothing_left": bool(s.verified) if s else None,
        "killed": list(s.killed) if s else [],
        "attention": list(state.attention),
    }
    if args.json:
        print(json.dumps({"source": "console", "kind": "result", **result}))
    else:
        where = (
            f"checkpoint at step {s.checkpoint_step}"
            if s and s.checkpoint_step is not None
            else "no new checkpoint"
        )
        print(
            f"{target.run_id}: {state.phase.value}; {where}"
            + ("; nothing of it left on any node" if s and s.verified else "")
        )
    for line in state.attention:
        print(f"taehv-console stop: needs attention: {line}", file=sys.stderr)
    return ExitCode.DONE if ok else ExitCode.FAILED
