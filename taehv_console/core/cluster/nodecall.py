"""How the console reads the helpers it runs on nodes (`python -m <module> ...`, over SSH or
here, through `runner.call` / `runner.open`): one reply type, one error that says which node,
which helper and what went wrong, and one line reader for streamed output.

A helper answers with one JSON object on the last line of its stdout that starts with "{" (a
node's login scripts may print before it). Whatever else happens (no connection, a timeout, an
exit status, no JSON, a reply cut short, keys missing, the helper's own refusal) becomes a
NodeCallError in the reply; `NodeReply.value()` raises it for callers that stop on failure.
This module sits below ssh.py (whose runners make the calls), so it imports nothing of it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import paramiko

TAIL_CHARS = 400


class Failure(str, Enum):
    UNREACHABLE = "unreachable"  # the node (or this machine's process table) could not run it
    TIMEOUT = "timeout"
    EXIT = "exit"  # non-zero exit status without a reply
    NOT_JSON = "not-json"  # no reply line, or one that is not a whole JSON object
    MISSING_KEYS = "missing-keys"
    REFUSED = "refused"  # the helper answered, with an error of its own


class SshError(Exception):
    """Reaching or running on a node failed. `fix` says what the user can do about it. (Defined
    here, below ssh.py, so a helper's failure is one of them; ssh.py exports it.)"""

    def __init__(self, host: str, message: str, fix: str = ""):
        super().__init__(message)
        self.host = host
        self.fix = fix


class NodeCallError(SshError):
    """A helper on a node gave no usable reply. The message starts `host: helper:`; `fix` says
    what to do where something can be done."""

    def __init__(
        self, host: str, helper: str, failure: Failure, detail: str, *, fix: str = "", stderr_tail: str = ""
    ):
        super().__init__(host, f"{host}: {helper}: {detail}", fix)
        self.helper = helper
        self.failure = failure
        self.detail = detail
        self.stderr_tail = stderr_tail

    def with_fix(self) -> str:
        return f"{self}" + (f" ({self.fix})" if self.fix else "")


@dataclass(frozen=True)
class NodeReply:
    """What one helper call gave: its JSON object (`data`) when `ok`, else `error`."""

    host: str
    helper: str
    ok: bool
    data: Mapping[str, Any] = field(default_factory=dict)
    error: NodeCallError | None = None
    stderr_tail: str = ""
    elapsed_s: float = 0.0
    started_at: float = 0.0

    def value(self) -> Mapping[str, Any]:
        """The reply's data; raises its NodeCallError when there is none."""
        if self.error is not None:
            raise self.error
        return self.data

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    @property
    def why(self) -> str:
        """What went wrong, for a person: the helper's own "error", else the call's (with its fix);
        empty when nothing did."""
        if self.data.get("error"):
            return str(self.data["error"])
        return self.error.with_fix() if self.error is not None else ""


def helper_name(module: str, args: Sequence[str] = ()) -> str:
    """How messages name a helper: the module's last part and its action, `nodecheck port-free`."""
    name = module.rsplit(".", 1)[-1]
    return f"{name} {args[0]}" if args and not str(args[0]).startswith("-") else name


def _tail(text: str) -> str:
    text = text.strip()
    return ("…" + text[-TAIL_CHARS:]) if len(text) > TAIL_CHARS else text


def fix_for_exit(status: int, tail: str, python: str, host: str) -> str:
    if status == 127 or "No such file or directory" in tail:
        return f"{python} is not on {host}: pass --python with the node's interpreter"
    if "No module named" in tail:
        return f"install taehv-console for {python} on {host} (pip install -e . in the project)"
    return "run the helper by hand on the node to see the whole error"


def parse_reply(
    host: str,
    helper: str,
    stdout: str,
    stderr: str = "",
    status: int = 0,
    *,
    require: Iterable[str] = (),
    python: str = "python",
    elapsed_s: float = 0.0,
    started_at: float = 0.0,
) -> NodeReply:
    """A helper's reply from what it printed and its exit status."""
    err_tail = _tail(stderr)

    def fail(
        failure: Failure, detail: str, fix: str = "", data: Mapping[str, Any] | None = None
    ) -> NodeReply:
        error = NodeCallError(host, helper, failure, detail, fix=fix, stderr_tail=err_tail)
        return NodeReply(
            host=host,
            helper=helper,
            ok=False,
            data=data or {},
            error=error,
            stderr_tail=err_tail,
            elapsed_s=elapsed_s,
            started_at=started_at,
        )

    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    line = next((ln.strip() for ln in reversed(lines) if ln.lstrip().startswith("{")), None)
    data: Any = None
    bad_json = ""
    if line is not None:
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            bad_json = f"its reply is not whole JSON ({err.msg} at column {err.colno}): {line[:120]!r}"
        else:
            if not isinstance(data, dict):
                data, bad_json = None, f"its reply is not a JSON object: {line[:120]!r}"
    if data is None and status != 0:
        tail = err_tail or _tail(stdout) or "no output"
        return fail(Failure.EXIT, f"exit {status}: {tail}", fix_for_exit(status, tail, python, host))
    if data is None:
        if bad_json:
            return fail(Failure.NOT_JSON, bad_json, "the helper was cut short: run it by hand on the node")
        first = lines[0][:120] if lines else ""
        detail = f"no JSON reply; its output began {first!r}" if first else "no JSON reply (no output)"
        return fail(
            Failure.NOT_JSON,
            detail + (f"; stderr: {err_tail}" if err_tail else ""),
            "check the node's login scripts (they must not print to stdout), or run the helper by hand",
        )
    assert line is not None  # data was parsed from it
    missing = [k for k in require if k not in data]
    if status != 0 or (missing and "error" in data):
        why = str(data.get("error") or f"exit {status}")
        return fail(Failure.REFUSED, why, data=data)
    if missing:
        return fail(Failure.MISSING_KEYS, f"its reply lacks {', '.join(missing)}: {line[:200]}", data=data)
    return NodeReply(
        host=host,
        helper=helper,
        ok=True,
        data=data,
        stderr_tail=err_tail,
        elapsed_s=elapsed_s,
        started_at=started_at,
    )


def read_reply(
    stream: NodeStream, host: str, helper: str, timeout: float, *, require: Iterable[str] = ()
) -> NodeReply:
    """The next reply line of a streamed helper (one that keeps running after it answers)."""
    t0 = time.monotonic()
    line = stream.readline(timeout)
    elapsed = time.monotonic() - t0
    stderr = stream.stderr_tail.decode(errors="replace")
    if line is None:
        failure, detail = (
            (Failure.EXIT, "ended without a reply")
            if stream.exited
            else (Failure.TIMEOUT, f"no reply within {timeout:g} s")
        )
        if stderr.strip():
            detail += f": {_tail(stderr)}"
        error = NodeCallError(host, helper, failure, detail, stderr_tail=_tail(stderr))
        return NodeReply(
            host=host, helper=helper, ok=False, error=error, stderr_tail=_tail(stderr), elapsed_s=elapsed
        )
    return parse_reply(host, helper, line, stderr, require=require, elapsed_s=elapsed)


# ------------------------------------------------------------------------------ streamed output


class NodeStream:
    """A running command's output, read line by line as it comes, from a local pipe or an SSH
    channel: the one reader of streamed output (port listeners, node agents). Lines are split here,
    not by a buffered file object, so a select() never says "nothing to read" while whole lines sit
    in a buffer; stderr is drained as it comes (a full pipe or window would stall the command) and
    its tail kept to say why a command ended."""

    STDERR_TAIL = 2000

    def __init__(self) -> None:
        self._buf = b""
        self.stderr_tail = b""
        self.exited = False  # stdout reached EOF: the command ended or the channel closed

    def _pump(self, timeout: float) -> bool:
        """Wait up to `timeout` for output and take what is there; False when nothing came."""
        raise NotImplementedError

    def _stderr(self, data: bytes) -> None:
        self.stderr_tail = (self.stderr_tail + data)[-self.STDERR_TAIL :]

    def _take(self, upto: int) -> str:
        line, self._buf = self._buf[:upto], self._buf[upto + 1 :]
        return line.decode(errors="replace")

    def readline(self, timeout: float) -> str | None:
        """The next line (without its newline) within `timeout`, else None. At EOF a last line
        without a newline is returned as it is: a reply cut short is the caller's to judge."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf and not self.exited:
            left = deadline - time.monotonic()
            if left <= 0 or not self._pump(left):
                break
        cut = self._buf.find(b"\n")
        if cut >= 0:
            return self._take(cut)
        if self.exited and self._buf:
            return self._take(len(self._buf))
        return None

    def read_lines(self) -> list[str]:
        """Every line that has arrived, without waiting (a poller's read)."""
        for _ in range(64):  # bounded: a chatty command must not hold the poller
            if self.exited or not self._pump(0.0):
                break
        lines = []
        while (line := self.readline(0.0)) is not None:
            lines.append(line)
        return lines

    def close(self) -> None:
        raise NotImplementedError


class ChannelStream(NodeStream):
    """A command on a node over SSH, its stdout streamed."""

    def __init__(self, channel: paramiko.Channel):
        super().__init__()
        self._chan = channel

    def _pump(self, timeout: float) -> bool:
        r, _, _ = select.select([self._chan], [], [], max(timeout, 0.0))
        if not r:
            return False
        while self._chan.recv_stderr_ready():
            self._stderr(self._chan.recv_stderr(65536))
        if self._chan.recv_ready():
            data = self._chan.recv(65536)
            self._buf += data
            self.exited = not data
        elif self._chan.exit_status_ready() or self._chan.closed or self._chan.eof_received:
            self.exited = True
        return True

    def close(self) -> None:
        # Closing the channel closes the command's stdin; our helpers exit on that.
        self._chan.close()


class PipeStream(NodeStream):
    """A command on this machine, its stdout streamed (raw pipes, never Python's buffered files)."""

    def __init__(self, proc: subprocess.Popen):
        super().__init__()
        self._proc = proc
        assert proc.stdout is not None and proc.stderr is not None
        self._open = {proc.stdout.fileno(): True, proc.stderr.fileno(): False}  # fd -> is stdout

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _pump(self, timeout: float) -> bool:
        if not self._open:
            self.exited = True
            return False
        r, _, _ = select.select(list(self._open), [], [], max(timeout, 0.0))
        for fd in r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                self.exited = self.exited or self._open[fd]
                del self._open[fd]
            elif self._open[fd]:
                self._buf += chunk
            else:
                self._stderr(chunk)
        return bool(r)

    def close(self) -> None:
        try:
            if self._proc.stdin:
                self._proc.stdin.close()  # our helpers' cue to exit
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()  # the process we started, by its own pid
            self._proc.wait()
        except OSError:
            pass
        for f in (self._proc.stdout, self._proc.stderr):
            if f:
                f.close()
