"""How every `taehv-console` command ends: one IntEnum scripts match on. Kept in a module of its
own (no imports) so `--help` can print the list without loading the flow.

Each command module names the codes it can return in EXIT_CODES ({ExitCode: what it means there}),
and its `--help` lists them (command_epilog). README.md and docs/design.md have the whole table."""

from __future__ import annotations

import enum
import textwrap


class ExitCode(enum.IntEnum):
    """How a command ended. An API: scripts match on the values, which never change."""

    DONE = 0  # every rank reached max_steps; final weights written (other commands: it worked)
    TRAINING_FAILED = 1  # a rank or launcher failed; state.json names the node and rank
    # the same 1 for the other commands: what they checked or did failed (a node's probe, a bad
    # checkpoint, a stop that left something, a key not added...). An alias, not another member.
    FAILED = 1
    USAGE = 2  # the command line, a config or the environment is wrong (argparse uses 2 too)
    PREFLIGHT_FAILED = 3  # preflight found errors; nothing was started
    STOPPED = 4  # stopped on request (signal, `taehv-console stop`); resumable from its checkpoint
    BUSY = 5  # another console controls the run, or it is already running (attach instead)
    # failed in a way another try would repeat (a trainer error, bad data, a full disk), or the
    # console's own restarts gave up: platforms should not retry (requeue) it
    FAILED_FINAL = 6
    # an unexpected error in the console itself (a bug): one line names the crash log that holds the
    # traceback. Not 1: platforms retry 1, and another try would crash the same way
    CRASHED = 70  # sysexits.h's EX_SOFTWARE
    INTERRUPTED = 130  # Ctrl-C before a run was being followed (shell convention); nothing was stopped
    # stdout's reader went away (`status --json | head`): SIGPIPE's shell convention, said by nothing
    # (stderr may be the same pipe); a run being followed keeps running under its supervisor
    OUTPUT_CLOSED = 141


def exit_code_for(phase: str, final: bool = False) -> ExitCode:
    """The exit code for a run that ended in `phase`: a run state Phase (a str enum) or its value."""
    value = getattr(phase, "value", phase)
    if value == "failed" and final:
        return ExitCode.FAILED_FINAL
    return {"done": ExitCode.DONE, "stopped": ExitCode.STOPPED, "failed": ExitCode.TRAINING_FAILED}.get(
        value, ExitCode.TRAINING_FAILED
    )


# what CRASHED means for every command: each command's EXIT_CODES lists it with these words
CRASHED_MEANING = (
    "an unexpected error (a bug): one line names the crash log holding the traceback; report it, do not retry"
)

EXIT_CODES_HELP = "exit codes: " + ", ".join(f"{c.value} {c.name.lower()}" for c in ExitCode)


# what OUTPUT_CLOSED means for every command: cli.main returns it for any of them, so every epilog
# lists it without each command's EXIT_CODES naming it
OUTPUT_CLOSED_MEANING = (
    "stdout's reader went away before the command finished (`| head`); a run being followed keeps running"
)


def command_epilog(codes: dict[ExitCode, str], width: int = 79) -> str:
    """A command's `--help` epilog: the codes it can return, one a paragraph (a parser with
    argparse.RawDescriptionHelpFormatter keeps the lines), with OUTPUT_CLOSED, which every command
    can return."""
    lines = ["exit codes:"]
    for code, meaning in sorted({ExitCode.OUTPUT_CLOSED: OUTPUT_CLOSED_MEANING, **codes}.items()):
        lines += textwrap.wrap(
            meaning, width, initial_indent=f"  {int(code):>3}  ", subsequent_indent=" " * 7
        )
    return "\n".join(lines)
