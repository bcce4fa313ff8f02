"""How `taehv-console --no-tui`, `attach` and `resume` end: an IntEnum scripts match on. Kept in
a module of its own (no imports) so `--help` can print the list without loading the flow."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """How `taehv-console --no-tui` (and attach/resume) ended. An API: scripts match on it."""

    DONE = 0  # every rank reached max_steps; final weights written
    TRAINING_FAILED = 1  # a rank or launcher failed; state.json names the node and rank
    USAGE = 2  # the command line, a config or the environment is wrong (argparse uses 2 too)
    PREFLIGHT_FAILED = 3  # preflight found errors; nothing was started
    STOPPED = 4  # stopped on request (signal, `taehv-console stop`); resumable from its checkpoint
    BUSY = 5  # another console controls the run, or it is already running (attach instead)
    # failed in a way another try would repeat (a trainer error, bad data, a full disk), or the
    # console's own restarts gave up: platforms should not retry (requeue) it
    FAILED_FINAL = 6
    INTERRUPTED = 130  # Ctrl-C before a run was being followed (shell convention); nothing was stopped


def exit_code_for(phase: str, final: bool = False) -> ExitCode:
    """The exit code for a run that ended in `phase`: a run state Phase (a str enum) or its value."""
    value = getattr(phase, "value", phase)
    if value == "failed" and final:
        return ExitCode.FAILED_FINAL
    return {"done": ExitCode.DONE, "stopped": ExitCode.STOPPED, "failed": ExitCode.TRAINING_FAILED}.get(
        value, ExitCode.TRAINING_FAILED
    )


EXIT_CODES_HELP = "exit codes: " + ", ".join(f"{c.value} {c.name.lower()}" for c in ExitCode)
