"""How an error ends a command: one mapping from the project's error classes to exit codes, for
every front end (cli.py's commands, headless.py, the TUI), beside exit_code_for(phase) for a run
that ended. An error whose class (or a base of it) is in ERROR_CODES is the user's to fix or a
node's state: its message names what and where, and it is printed as one line. Anything else is a
bug: its traceback goes to a crash log, and the user sees one line naming that log (CRASHED, 70).

Imports no torch: the trainer's user-facing errors live in trainer/errors.py for this reason.
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
import traceback
from pathlib import Path

from taehv_console.core.cluster.hosts import HostfileError
from taehv_console.core.cluster.nodecall import SshError
from taehv_console.core.cluster.platform import TopologyError
from taehv_console.core.cluster.ssh.errors import (
    HostKeyChangedError,
    HostKeyUnknownError,
    SshAuthError,
    SshConfigError,
)
from taehv_console.core.flow.launch import PlatformRunError
from taehv_console.core.flow.options import EnvError
from taehv_console.core.hostnames import InvalidHostError
from taehv_console.core.run.lock import RunBusyError
from taehv_console.core.run.outcome import (
    AllocationTooSmallError,
    ControlError,
    LaunchError,
    NothingToResumeError,
    RunLiveError,
    WorldSizeChangedError,
)
from taehv_console.core.run.rundir import RunNotFoundError
from taehv_console.core.run.state import StateError
from taehv_console.core.values import InputError
from taehv_console.core.watch.samples import SamplesError
from taehv_console.exit_codes import ExitCode
from trainer.checkpoint import CheckpointError
from trainer.config import ConfigError
from trainer.errors import CacheError, DataSourceError, EvalError, TeacherError, WeightsError

# error class -> exit code. The most specific class wins: a class's own entry, else its nearest
# base's (exit_code_for_error walks the MRO), so RunLiveError is BUSY though ControlError is FAILED.
ERROR_CODES: dict[type[BaseException], ExitCode] = {
    # what the user gave is wrong: the command line, a config, a hostfile, the named run, a file
    ConfigError: ExitCode.USAGE,  # a preset, --set, run.toml (DeriveError too)
    InputError: ExitCode.USAGE,  # an option's or a field's value out of its range (core/values.py)
    EnvError: ExitCode.USAGE,
    HostfileError: ExitCode.USAGE,
    InvalidHostError: ExitCode.USAGE,
    TopologyError: ExitCode.USAGE,
    PlatformRunError: ExitCode.USAGE,
    RunNotFoundError: ExitCode.USAGE,
    StateError: ExitCode.USAGE,  # a damaged run: named by file and field
    NothingToResumeError: ExitCode.USAGE,
    WorldSizeChangedError: ExitCode.USAGE,
    AllocationTooSmallError: ExitCode.USAGE,
    WeightsError: ExitCode.USAGE,
    TeacherError: ExitCode.USAGE,
    DataSourceError: ExitCode.USAGE,
    EvalError: ExitCode.USAGE,
    CacheError: ExitCode.USAGE,
    CheckpointError: ExitCode.USAGE,
    SamplesError: ExitCode.USAGE,
    # SSH set up so that no try gets further: the config, a host key, a login
    SshConfigError: ExitCode.USAGE,
    HostKeyUnknownError: ExitCode.USAGE,
    HostKeyChangedError: ExitCode.USAGE,
    SshAuthError: ExitCode.USAGE,
    # the run is someone else's right now
    RunBusyError: ExitCode.BUSY,
    RunLiveError: ExitCode.BUSY,
    # a node did not answer, or the run could not be controlled: another try may get past it
    SshError: ExitCode.FAILED,
    ControlError: ExitCode.FAILED,
    LaunchError: ExitCode.TRAINING_FAILED,
}

CRASH_DIR_ENV = "TAEHV_CRASH_DIR"  # where crash logs go (tests; default below)


def exit_code_for_error(err: BaseException) -> ExitCode | None:
    """The exit code of a known error (its class's or its nearest base's), or None: a bug."""
    for cls in type(err).__mro__:
        code = ERROR_CODES.get(cls)
        if code is not None:
            return code
    return None


def crash_dir() -> Path:
    """$TAEHV_CRASH_DIR, else $XDG_STATE_HOME/taehv-console/crashes (~/.local/state/...)."""
    if os.environ.get(CRASH_DIR_ENV):
        return Path(os.environ[CRASH_DIR_ENV])
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "taehv-console" / "crashes"


def write_crash_log(err: BaseException, argv: list[str] | None = None) -> Path:
    """Write err's traceback (and the command line) to a new file; returns its path. Falls back to
    the temp folder when the crash folder cannot be written."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    text = (
        f"taehv-console crash at {datetime.datetime.now().isoformat(timespec='seconds')}\n"
        f"argv: {argv if argv is not None else sys.argv}\n"
        f"python: {sys.version.split()[0]}\n\n" + "".join(traceback.format_exception(err))
    )
    for folder in (crash_dir(), Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"crash-{stamp}-{os.getpid()}.log"
            path.write_text(text, encoding="utf-8")
            return path
        except OSError:
            continue
    raise err  # nowhere to write: the traceback itself is the report


def describe_error(err: BaseException, argv: list[str] | None = None) -> tuple[ExitCode, str]:
    """(exit code, one line for the user) for any exception a command let through: a known
    error's own message, or an unexpected one's type and message with the crash log's path."""
    code = exit_code_for_error(err)
    if code is not None:
        return code, str(err) or type(err).__name__
    log = write_crash_log(err, argv)
    detail = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return (
        ExitCode.CRASHED,
        f"unexpected error ({detail}); the traceback is in {log}: please report it",
    )
