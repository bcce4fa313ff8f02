"""Who owns a run while no window is open: one supervisor process per run on the head node
(`taehv-console supervise RUN`), started detached when a run is launched, resumed or attached.

The run lock decides who controls the run. A supervisor waits for the lock in standby while a
console holds it, and takes it the moment that console quits or dies (the kernel drops a dead
holder's flock), so recovery and notifications go on with every window closed. A console that
opens a run the supervisor holds asks for it (RUN/handover.request): the supervisor lets go between
two rounds of its loop, never in the middle of a stop or a restart, and goes back to standby.

Files: RUN/supervisor.json (pid, host, start time; written by the supervisor), RUN/supervisor.log
(its output), RUN/handover.request (a console's request, removed by whoever took the lock).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from taehv_console.core.cluster.ssh import SshSettings
from taehv_console.core.models import BackendKind
from taehv_console.core.run.lock import RunBusyError, RunLock
from taehv_console.core.run.rundir import RunDir

PURPOSE = "supervise"
# TAEHV_SUPERVISOR=off: no supervisor is started (a platform pod is its own supervisor; tests
# about one console's behaviour turn it off)
ENV_SWITCH = "TAEHV_SUPERVISOR"
HANDOVER_WAIT_S = 15.0


def handover_path(run: RunDir) -> Path:
    return run.path / "handover.request"


def info_path(run: RunDir) -> Path:
    return run.path / "supervisor.json"


def log_path(run: RunDir) -> Path:
    return run.path / "supervisor.log"


def enabled(env: dict[str, str] | None = None) -> bool:
    return (env if env is not None else os.environ).get(ENV_SWITCH, "on").lower() not in ("off", "0", "no")


def _cmdline(pid: int) -> list[str]:
    """The process's command line; [] when it is gone or a zombie (exited, not yet reaped)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def running_supervisor(run: RunDir) -> dict[str, Any] | None:
    """The run's supervisor as supervisor.json names it, when that process is alive on this host
    and is a supervisor of this run (a reused pid is not)."""
    try:
        info = json.loads(info_path(run).read_bytes())
    except (OSError, ValueError, RecursionError):  # ValueError: not JSON, not UTF-8
        return None
    if not isinstance(info, dict):
        return None  # damaged: it names no supervisor
    pid = info.get("pid")
    if not isinstance(pid, int) or info.get("host") != socket.gethostname():
        return None
    argv = _cmdline(pid)
    if PURPOSE not in argv or str(run.path) not in argv:
        return None
    return info


def write_info(run: RunDir, pid: int | None = None) -> None:
    """supervisor.json: this process (the supervisor), or the `pid` of one just started."""
    tmp = info_path(run).with_name(f".supervisor.json.{os.getpid()}")
    pid = pid if pid is not None else os.getpid()
    tmp.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": time.time()}))
    os.replace(tmp, info_path(run))


def supervised(kind: BackendKind) -> bool:
    """Whether a run of this backend gets a supervisor on the head node: a platform pod's console
    is the pod's foreground process, and the platform restarts it."""
    return kind is not BackendKind.PLATFORM


def ssh_env(settings: SshSettings) -> dict[str, str]:
    """The environment that gives a supervisor the console's way to the nodes (the settings a
    console took from its --ssh-config, --known-hosts and --python options or from these variables)."""
    return {
        "TAEHV_SSH_CONFIG": settings.config_path,
        "TAEHV_KNOWN_HOSTS": settings.known_hosts_path,
        "TAEHV_REMOTE_PYTHON": settings.python,
    }


def spawn_supervisor(run: RunDir, env: Mapping[str, str] | None = None) -> int | None:
    """Start the run's supervisor, detached from this terminal (its own session, stdin from
    /dev/null, output to RUN/supervisor.log), unless one runs already or TAEHV_SUPERVISOR=off;
    `env` adds to this process's environment (ssh_env: how to reach the nodes). Returns its pid, or
    None when none was started."""
    if not enabled():
        return None
    found = running_supervisor(run)
    if found is not None:
        return int(found["pid"])
    argv = [sys.executable, "-m", "taehv_console.cli", PURPOSE, str(run.path)]
    with open(log_path(run), "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=run.path,
            close_fds=True,
            env={**os.environ, **(env or {})},
        )
    # named at once (its command line says what it is from exec on), not after its imports: a
    # client checking a second later must not take it for gone and start another
    write_info(run, proc.pid)
    return proc.pid


def request_handover(run: RunDir, lock_path: Path, purpose: str, busy: RunBusyError) -> RunLock:
    """Take the lock from the run's supervisor: ask it to let go and wait for it (up to
    HANDOVER_WAIT_S). Re-raises `busy` when the holder is not a supervisor or does not let go."""
    if busy.holder.get("purpose") != PURPOSE:
        raise busy
    request = handover_path(run)
    tmp = request.with_name(f".{request.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}))
    os.replace(tmp, request)
    deadline = time.time() + HANDOVER_WAIT_S
    try:
        while True:
            try:
                return RunLock(lock_path, purpose).acquire()
            except RunBusyError:
                if time.time() >= deadline:
                    raise busy from None
                time.sleep(0.2)
    finally:
        request.unlink(missing_ok=True)
