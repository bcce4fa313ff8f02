"""How the monitor hears a node's agent: a line stream that is read without blocking, started
here or on a node over SSH through the runner's stream; closing it ends the agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

from taehv_console.core.cluster.nodecall import PipeStream
from taehv_console.core.cluster.ssh import LocalRunner, NodeRunner


class LineStream(Protocol):
    """A running agent's output. read_lines never blocks for long; exited is True after EOF."""

    @property
    def exited(self) -> bool: ...

    def read_lines(self) -> list[str]: ...
    def close(self) -> None: ...


class RemoteLineStream:
    """An agent started through a node runner (runner.open): over SSH, or here. Its output is
    read by the runner's one line reader; closing it ends the agent."""

    def __init__(self, runner: NodeRunner, argv: Sequence[str]):
        self._stream = runner.open(list(argv))

    @property
    def exited(self) -> bool:
        return self._stream.exited

    @property
    def stderr_tail(self) -> bytes:
        return self._stream.stderr_tail

    def read_lines(self) -> list[str]:
        return self._stream.read_lines()

    def close(self) -> None:
        self._stream.close()


class LocalLineStream(RemoteLineStream):
    """An agent started on this machine."""

    def __init__(self, argv: Sequence[str]):
        super().__init__(LocalRunner(), argv)

    @property
    def pid(self) -> int:
        return cast(PipeStream, self._stream).pid  # LocalRunner.open starts a PipeStream


def agent_argv(python: str, run_dir: str, interval: float) -> list[str]:
    return [python, "-m", "taehv_console.core.watch.agent", "--interval", f"{interval:g}", "--run", run_dir]
