"""How the monitor hears a node's agent: a line stream that is read without blocking, started
here (a subprocess) or on a node over SSH (the runner's stream); closing it ends the agent.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Sequence
from typing import Any, Protocol


class LineStream(Protocol):
    """A running agent's output. read_lines never blocks for long; exited is True after EOF."""

    exited: bool

    def read_lines(self) -> list[str]: ...
    def close(self) -> None: ...


class LocalLineStream:
    """An agent started here, its stdout read without blocking. Closing stdin ends it."""

    def __init__(self, argv: Sequence[str]):
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0, start_new_session=True)  # fmt: skip
        for f in (self.proc.stdout, self.proc.stderr):
            assert f is not None
            fl = fcntl.fcntl(f.fileno(), fcntl.F_GETFL)
            fcntl.fcntl(f.fileno(), fcntl.F_SETFL, fl | os.O_NONBLOCK)
        self._buf = b""
        self.stderr_tail = b""
        self.exited = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read_lines(self) -> list[str]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        while True:
            try:
                data = os.read(self.proc.stdout.fileno(), 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.exited = True
                break
            self._buf += data
        try:
            err = os.read(self.proc.stderr.fileno(), 1 << 16)
            self.stderr_tail = (self.stderr_tail + err)[-2000:]
        except (BlockingIOError, OSError):
            pass
        if b"\n" not in self._buf:
            return []
        head, _, self._buf = self._buf.rpartition(b"\n")
        return head.decode(errors="replace").split("\n")

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()  # the agent's cue to exit
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # the process we started, by its own pid
            self.proc.wait()
        except OSError:
            pass
        for f in (self.proc.stdout, self.proc.stderr):
            if f:
                f.close()


class RemoteLineStream:
    """An agent on a node over SSH (runner.open). A dead channel reads as silence; the monitor
    restarts an agent that stays silent past the agent timeout."""

    def __init__(self, runner: Any, argv: Sequence[str]):
        self._stream = runner.open(list(argv))
        self.exited = False

    def read_lines(self) -> list[str]:
        out = []
        for _ in range(1000):
            line = self._stream.readline(0.002)
            if line is None:
                break
            out.append(line)
        return out

    def close(self) -> None:
        self._stream.close()


def agent_argv(python: str, run_dir: str, interval: float) -> list[str]:
    return [python, "-m", "taehv_console.core.watch.agent", "--interval", f"{interval:g}", "--run", run_dir]
