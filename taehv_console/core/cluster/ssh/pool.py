"""SshPool: connections to many nodes, opened on first use and reused; a node that stops answering
is marked down (answered at once) and reconnected in the background. fan_out runs per-node work."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from taehv_console.core.cluster.hosts import is_local_host, validate_host
from taehv_console.core.cluster.nodecall import NodeReply, helper_name
from taehv_console.core.cluster.ssh.calls import NodeRunner, reply_for_error
from taehv_console.core.cluster.ssh.config import SshSettings
from taehv_console.core.cluster.ssh.errors import SshTimeoutError, SshUnreachableError
from taehv_console.core.cluster.ssh.runners import LocalRunner, SshConnection, connect
from taehv_console.core.models import CommandResult

if TYPE_CHECKING:  # 3.10 has no typing.Self
    from typing_extensions import Self

T = TypeVar("T")


@dataclass
class _Down:
    why: str
    since: float
    next_try: float
    trying: bool = False


def fan_out(
    items: Iterable[str], fn: Callable[[str], T], max_parallel: int, deadline_s: float | None = None
) -> dict[str, T | Exception]:
    """fn(item) for every item at once (bounded by max_parallel threads); exceptions are returned
    in place of results, so one bad node never hides the others. Keys keep the input order.
    With deadline_s, an item not done by then is returned as a TimeoutError and not waited for."""
    items = list(items)
    if not items:
        return {}
    out: dict[str, T | Exception] = {}
    ex = ThreadPoolExecutor(
        max_workers=max(1, min(max_parallel, len(items))), thread_name_prefix="taehv-node"
    )
    end = None if deadline_s is None else time.monotonic() + deadline_s
    try:
        futures = {item: ex.submit(fn, item) for item in items}
        for item, fut in futures.items():
            try:
                out[item] = fut.result(timeout=None if end is None else max(0.0, end - time.monotonic()))
            except FuturesTimeout:
                out[item] = TimeoutError(f"{item}: no answer within {deadline_s:g} s")
            except Exception as err:  # noqa: BLE001 - returned, not raised: the caller reports per node
                out[item] = err
    finally:
        ex.shutdown(wait=end is None, cancel_futures=True)
    return out


class SshPool:
    """Connections to many nodes, opened on first use and kept for reuse; `runner(host)` gives a
    NodeRunner (LocalRunner for localhost). Use as a context manager so connections close."""

    def __init__(self, settings: SshSettings | None = None):
        self.settings = settings or SshSettings.from_env()
        self._conns: dict[str, SshConnection] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._down: dict[str, _Down] = {}  # unreachable nodes, reconnected in the background

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def runner(self, host: str) -> NodeRunner:
        validate_host(host)
        if is_local_host(host):
            return LocalRunner(host, self.settings.python, self.settings.command_timeout_s)
        return self.connection(host)

    def connection(self, host: str) -> SshConnection:
        validate_host(host)  # before any lookup, socket or thread
        with self._guard:
            lock = self._locks.setdefault(host, threading.Lock())
            down = self._down.get(host)
        if down is not None:
            self._retry(host, down)
            raise SshUnreachableError(
                host,
                f"{host}: unreachable: {down.why} ({time.monotonic() - down.since:.0f} s ago); "
                "reconnecting in the background",
                "check the node (frozen, overloaded or cut off)",
            )
        with lock:  # one handshake per host even when several threads ask at once
            conn = self._conns.get(host)
            if conn is None or not conn.is_active():
                try:
                    conn = connect(host, self.settings, self._mark_down)
                except SshTimeoutError as err:  # a port that answers no handshake: down, as above
                    self._mark_down(host, str(err).removeprefix(f"{host}: "))
                    raise
                self._conns[host] = conn
            return conn

    def _mark_down(self, host: str, why: str) -> None:
        with self._guard:
            self._down.setdefault(
                host,
                _Down(
                    why=why,
                    since=time.monotonic(),
                    next_try=time.monotonic() + self.settings.retry_unreachable_s,
                ),
            )

    def _retry(self, host: str, down: _Down) -> None:
        """One background reconnection at a time per node; the caller never waits for it."""
        with self._guard:
            if down.trying or time.monotonic() < down.next_try:
                return
            down.trying = True

        def attempt() -> None:
            try:
                conn = connect(host, self.settings, self._mark_down)
            except Exception:  # noqa: BLE001 - still down, for whatever reason: try again later
                with self._guard:
                    down.trying = False
                    down.next_try = time.monotonic() + self.settings.retry_unreachable_s
                return
            with self._guard:
                old = self._conns.get(host)
                self._conns[host] = conn
                self._down.pop(host, None)
            if old is not None:
                old.close()

        threading.Thread(target=attempt, name=f"taehv-reconnect-{host}", daemon=True).start()

    def map(self, hosts: Iterable[str], fn: Callable[[NodeRunner], T]) -> dict[str, T | Exception]:
        """fn(runner) on every host in parallel; per-host exceptions are returned, not raised."""
        hosts = list(hosts)
        for h in hosts:
            validate_host(h)  # all names checked before the first connection is made
        return fan_out(hosts, lambda h: fn(self.runner(h)), self.settings.max_parallel)

    def is_down(self, host: str) -> bool:
        with self._guard:
            return host in self._down

    def call(self, host: str, module: str, args: Sequence[str] = (), **kw: Any) -> NodeReply:
        """runner(host).call(...); a node that cannot be reached is a failed reply, not a raise."""
        try:
            runner = self.runner(host)
        except Exception as err:  # noqa: BLE001 - the reply carries it
            return reply_for_error(host, helper_name(module, args), err, python=self.settings.python)
        return runner.call(module, args, **kw)

    def call_all(
        self, hosts: Iterable[str], module: str, args: Sequence[str] = (), **kw: Any
    ) -> dict[str, NodeReply]:
        """The same helper call on every host in parallel, one reply per host (in input order)."""
        hosts = list(hosts)
        got = fan_out(hosts, lambda h: self.call(h, module, args, **kw), self.settings.max_parallel)
        return {
            h: r if isinstance(r, NodeReply) else reply_for_error(h, helper_name(module, args), r)
            for h, r in got.items()
        }

    def run_all(
        self,
        hosts: Iterable[str],
        argv: Sequence[str] | Callable[[str], Sequence[str]],
        *,
        timeout: float | None = None,
    ) -> dict[str, CommandResult | Exception]:
        """The same argv (or argv per host) on every host in parallel."""
        make = argv if callable(argv) else (lambda _h: argv)
        return self.map(hosts, lambda r: r.run(make(r.host), timeout=timeout))

    def close(self) -> None:
        with self._guard:
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            c.close()
