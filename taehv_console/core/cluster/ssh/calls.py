"""The helper-call protocol both runners share: argv made shell-safe, the NodeRunner interface, and
`call` (a project module run on the node, its JSON reply read) with the process-group helpers."""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from taehv_console.core.cluster.nodecall import (
    Failure,
    NodeCallError,
    NodeReply,
    NodeStream,
    SshError,
    fix_for_exit,
    helper_name,
    parse_reply,
)
from taehv_console.core.cluster.ssh.errors import CommandError, CommandTimeoutError
from taehv_console.core.models import CommandResult

SPAWN = "taehv_console.core.cluster.spawn"
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def build_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """One shell-safe command line from argv (and `env KEY=VALUE` assignments in front).

    Line breaks are refused although shlex.join would quote them: csh-family login shells do not
    accept a newline inside quotes, and no command of ours needs one.
    """
    if isinstance(argv, str) or not argv:
        raise CommandError("a command must be a non-empty argv list, not a string")
    words = []
    if env:
        words.append("env")
        for k, v in env.items():
            if not _ENV_KEY.fullmatch(k):
                raise CommandError(f"environment variable name {k!r} is not a plain name")
            words.append(f"{k}={v}")
    words.extend(argv)
    for w in words:
        if not isinstance(w, str):
            raise CommandError(f"argv items must be strings, got {type(w).__name__} {w!r}")
        if "\0" in w or "\n" in w or "\r" in w:
            raise CommandError(f"argv item {w!r} contains a NUL or line break")
    return shlex.join(words)


@dataclass(frozen=True)
class DetachedProcess:
    """A process started in its own session on a node: stop it by signalling `pgid`."""

    host: str
    pid: int
    pgid: int
    log: str
    start_ticks: int | None = None  # the process's start time, read at spawn (None: an old node helper)
    boot_id: str = ""


class NodeRunner(Protocol):
    """What preflight and launch need from a node, whether reached by SSH or local."""

    host: str
    python: str

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        stdin_data: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult: ...
    def open(self, argv: Sequence[str]) -> NodeStream: ...
    def call(
        self,
        module: str,
        args: Sequence[str] = (),
        *,
        timeout: float | None = None,
        stdin_data: str | None = None,
        env: Mapping[str, str] | None = None,
        require: Iterable[str] = (),
        in_process: Callable[[list[str]], Mapping[str, Any]] | None = None,
    ) -> NodeReply: ...
    def start_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = 30,
    ) -> DetachedProcess: ...


def reply_for_error(
    host: str, helper: str, err: BaseException, *, python: str = "python", elapsed_s: float = 0.0
) -> NodeReply:
    """The reply of a helper call that never ran (the node unreachable, a timeout, no python)."""
    if isinstance(err, NodeCallError):
        return NodeReply(host=host, helper=helper, ok=False, error=err, elapsed_s=elapsed_s)
    text, fix = str(err).removeprefix(f"{host}: "), getattr(err, "fix", "")
    if isinstance(err, (CommandTimeoutError, TimeoutError)):
        # "<python> did not finish within N s": the helper's name is in the message already
        failure = Failure.TIMEOUT
        if "did not finish " in text:
            text = "did not finish " + text.split("did not finish ", 1)[1]
    elif isinstance(err, SshError):
        failure = Failure.UNREACHABLE
    elif isinstance(err, CommandError):
        failure, text = Failure.UNREACHABLE, f"cannot be sent: {err}"
    elif isinstance(err, FileNotFoundError):
        failure, text, fix = Failure.EXIT, f"cannot start: {err}", fix_for_exit(127, "", python, host)
    else:
        failure, text = Failure.UNREACHABLE, f"cannot run: {type(err).__name__}: {err}"
    error = NodeCallError(host, helper, failure, text or type(err).__name__, fix=fix)
    return NodeReply(host=host, helper=helper, ok=False, error=error, elapsed_s=elapsed_s)


class HelperCalls:
    """The one way to run a project helper on the node (`call`), and the process-group helpers
    built on it; shared by both runners, so SSH and this machine behave the same."""

    host: str
    python: str
    runs_here = False

    def run(  # pragma: no cover - overridden
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        stdin_data: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        raise NotImplementedError

    def call(
        self,
        module: str,
        args: Sequence[str] = (),
        *,
        timeout: float | None = None,
        stdin_data: str | None = None,
        env: Mapping[str, str] | None = None,
        require: Iterable[str] = (),
        in_process: Callable[[list[str]], Mapping[str, Any]] | None = None,
    ) -> NodeReply:
        """Run `python -m module args...` on the node and read its JSON reply. Never raises for a
        node's problem: the reply carries it (`.value()` raises it). `in_process` does the same
        work without starting a Python, on this machine only (for polls every second)."""
        helper = helper_name(module, args)
        require = tuple(require)
        started, t0 = time.time(), time.monotonic()
        if in_process is not None and self.runs_here:
            try:
                data = dict(in_process(list(args)))
            except Exception as err:  # noqa: BLE001 - the same reply as a helper that crashed
                return reply_for_error(
                    self.host, helper, err, python=self.python, elapsed_s=time.monotonic() - t0
                )
            return parse_reply(
                self.host,
                helper,
                json.dumps(data),
                require=require,
                python=self.python,
                elapsed_s=time.monotonic() - t0,
                started_at=started,
            )
        try:
            res = self.run(
                [self.python, "-m", module, *args], timeout=timeout, stdin_data=stdin_data, env=env
            )
        except Exception as err:  # noqa: BLE001 - every failure to run becomes the reply's error
            return reply_for_error(
                self.host, helper, err, python=self.python, elapsed_s=time.monotonic() - t0
            )
        return parse_reply(
            self.host,
            helper,
            res.stdout,
            res.stderr,
            res.exit_status,
            require=require,
            python=self.python,
            elapsed_s=res.seconds,
            started_at=res.started_at or started,
        )

    def start_detached(
        self,
        argv: Sequence[str],
        *,
        log_path: str,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = 30,
    ) -> DetachedProcess:
        """Start argv on the node in a new session (setsid), stdin /dev/null, output appended to
        log_path; return its pid and pgid at once. The process outlives this connection."""
        args = ["start", "--log", log_path] + (["--cwd", cwd] if cwd else [])
        for k, v in (env or {}).items():
            if not _ENV_KEY.fullmatch(k):
                raise CommandError(f"environment variable name {k!r} is not a plain name")
            args += ["--env", f"{k}={v}"]
        reply = self.call(SPAWN, [*args, "--", *argv], timeout=timeout, require=("pid", "pgid", "log"))
        if reply.error is not None and reply.error.failure is Failure.REFUSED:
            raise NodeCallError(
                self.host, reply.helper, Failure.REFUSED, f"cannot start {argv[0]}: {reply.error.detail}"
            )
        out = reply.value()
        ticks = out.get("start_ticks")
        return DetachedProcess(
            host=self.host,
            pid=int(out["pid"]),
            pgid=int(out["pgid"]),
            log=out["log"],
            start_ticks=int(ticks) if isinstance(ticks, int) else None,
            boot_id=str(out.get("boot_id") or ""),
        )

    def signal_group(self, proc: DetachedProcess, sig: str = "TERM", *, timeout: float | None = 30) -> bool:
        """Signal the process group of a process `start_detached` started on the node, once the node
        has proven its leader is still that process (start time and boot id read at spawn); False
        when the group is gone or cannot be proven (nothing is sent then)."""
        if proc.start_ticks is None:
            return False  # a node helper too old to say when it started: nothing to prove it by
        args = ["signal", "--pgid", str(int(proc.pgid)), "--start-ticks", str(int(proc.start_ticks))]
        args += ["--boot-id", proc.boot_id] if proc.boot_id else []
        reply = self.call(SPAWN, [*args, "--signal", sig], timeout=timeout)
        return bool(reply.value().get("sent"))

    def group_pids(self, proc: DetachedProcess, *, timeout: float | None = 30) -> tuple[int, ...]:
        """Live processes of the group of a process `start_detached` started on the node, once the
        node has proven its leader is still that process (as for `signal_group`); empty when the
        group is gone or cannot be proven, since a pgid alone may by now name someone else's."""
        if proc.start_ticks is None:
            return ()
        args = ["pids", "--pgid", str(int(proc.pgid)), "--start-ticks", str(int(proc.start_ticks))]
        args += ["--boot-id", proc.boot_id] if proc.boot_id else []
        reply = self.call(SPAWN, args, timeout=timeout, require=("pids",))
        return tuple(int(p) for p in reply.value()["pids"])
