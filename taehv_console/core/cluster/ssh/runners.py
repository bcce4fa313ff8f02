"""The two runners: SshConnection (one paramiko connection, every request under a watchdog) with
`connect`, and LocalRunner (this machine, no shell); both make helper calls through HelperCalls."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn

from taehv_console.core.cluster.nodecall import ChannelStream, NodeStream, PipeStream, SshError
from taehv_console.core.cluster.ssh.calls import HelperCalls, build_command
from taehv_console.core.cluster.ssh.config import (
    HostTarget,
    SshSettings,
    open_socket,
    quiet_paramiko,
    resolve_target,
)
from taehv_console.core.cluster.ssh.errors import (
    CommandTimeoutError,
    HostKeyChangedError,
    SshAuthError,
    SshConnectError,
    SshTimeoutError,
    SshUnreachableError,
)
from taehv_console.core.cluster.ssh.hostkeys import refusing_policy, sha256_fingerprint
from taehv_console.core.hostnames import host_port
from taehv_console.core.models import CommandResult

if TYPE_CHECKING:
    import paramiko


class SshConnection(HelperCalls):
    """One authenticated SSH connection to a node. Channels may be opened from several threads.

    Every request has a deadline, including the steps paramiko would wait on forever (a channel
    open or exec request a frozen sshd never answers): past `answer_timeout_s` the connection is
    dropped and the node reported unreachable (to `on_unreachable`, the pool's)."""

    def __init__(
        self,
        target: HostTarget,
        client: paramiko.SSHClient,
        settings: SshSettings,
        on_unreachable: Callable[[str, str], None] | None = None,
    ):
        self.target = target
        self.host = target.alias
        self.python = settings.python
        self._client = client
        self._settings = settings
        self._on_unreachable = on_unreachable  # the pool's: remember the node is down

    def is_active(self) -> bool:
        """Whether the connection is still up: False once it was dropped, lost or closed."""
        transport = self._client.get_transport()
        return transport is not None and transport.is_active()

    def _channel(self, command: str, deadline: float | None = None) -> paramiko.Channel:
        """An exec channel, opened and started within answer_timeout_s (and before `deadline`).

        paramiko's exec_command waits for the server's reply without any timeout: a watchdog
        closes the transport at the deadline, which wakes that wait (and every other waiter on
        this connection, which is as dead for them)."""
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise SshConnectError(
                self.host,
                f"{self.host}: the SSH connection was lost",
                "check the node; the next attempt reconnects",
            )
        wait = self._settings.answer_timeout_s
        if deadline is not None:
            wait = max(0.05, min(wait, deadline - time.monotonic()))
        fired = threading.Event()

        def give_up() -> None:
            fired.set()
            transport.close()

        watchdog = threading.Timer(wait, give_up)
        watchdog.daemon = True
        watchdog.start()
        try:
            chan = transport.open_session(timeout=wait)
            # exec without a pty: a remote process is not tied to this channel's lifetime
            chan.exec_command(command)
        except Exception as err:
            if (
                not fired.is_set()
                and not isinstance(err, (TimeoutError, socket.timeout))
                and "Timeout" not in str(err)
            ):
                if not transport.is_active():  # the peer closed it (sshd gone, node rebooted)
                    raise SshConnectError(
                        self.host,
                        f"{self.host}: the SSH connection was lost ({type(err).__name__}: {err})".replace(
                            ": )", ")"
                        ),
                        "check the node; the next attempt reconnects",
                    ) from None
                raise
            give_up()
            self._unreachable(f"no answer to a request within {wait:g} s on a working connection")
        finally:
            watchdog.cancel()
        if fired.is_set():  # it answered just as the watchdog fired: the transport is gone anyway
            self._unreachable(f"no answer to a request within {wait:g} s on a working connection")
        return chan

    def _unreachable(self, why: str) -> NoReturn:
        if self._on_unreachable is not None:
            self._on_unreachable(self.host, why)
        raise SshUnreachableError(
            self.host,
            f"{self.host}: unreachable: {why}; connection dropped",
            "check the node (frozen, overloaded or cut off); the console keeps trying to reach it",
        )

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        stdin_data: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run argv on the node and wait for it; raise CommandTimeoutError past `timeout`."""
        command = build_command(argv, env)
        timeout = self._settings.command_timeout_s if timeout is None else timeout
        started, t0 = time.time(), time.monotonic()
        deadline = t0 + timeout
        chan = self._channel(command, deadline)
        try:
            chan.settimeout(max(0.05, deadline - time.monotonic()))  # sendall on a full window
            if stdin_data:
                chan.sendall(stdin_data.encode())
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            while True:
                while chan.recv_ready():
                    out += chan.recv(65536)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommandTimeoutError(
                        self.host,
                        f"{self.host}: {argv[0]} did not finish within {timeout:g} s",
                        "the node may be overloaded or the command stuck; raise the timeout or look at the node",
                    )
                select.select([chan], [], [], min(left, 1.0))
            status = chan.recv_exit_status()
        finally:
            chan.close()
        return CommandResult(
            host=self.host,
            argv=tuple(argv),
            exit_status=status,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            seconds=time.monotonic() - t0,
            started_at=started,
        )

    def open(self, argv: Sequence[str]) -> NodeStream:
        return ChannelStream(self._channel(build_command(argv)))

    def close(self) -> None:
        self._client.close()


def _handshake_error(
    alias: str, target: HostTarget, err: BaseException, elapsed: float, timeout: float
) -> SshError:
    """What a failed SSH handshake means, said with the time it really took: a port that accepted
    TCP and stayed silent for the whole timeout, one that closed the connection at once (not an SSH
    server, or sshd turning the client away before its banner: MaxStartups, tcp wrappers), or
    another SSH-level failure."""
    where = host_port(target.hostname, target.port)
    text = str(err) or type(err).__name__
    if elapsed >= 0.9 * timeout or isinstance(err, TimeoutError) or "timeout" in text.lower():
        return SshTimeoutError(
            alias,
            f"{alias}: no SSH handshake within {timeout:g} s: {where} accepts TCP but no SSH server answered",
            "check sshd on the node (wedged, overloaded) or what else holds the port",
        )
    # paramiko's words for a peer that closed before or while sending its banner; "No existing
    # session" is what connect says when its transport thread died of that first
    if (
        isinstance(err, EOFError)
        or "banner" in text.lower()
        or "no existing session" in text.lower()
        or isinstance(err, ConnectionResetError)
    ):
        return SshConnectError(
            alias,
            f"{alias}: {where} accepted TCP and closed the connection after {elapsed:.2f} s without "
            "an SSH banner",
            "check that sshd listens on that port (not another service), and its MaxStartups and "
            "access rules",
        )
    return SshConnectError(
        alias, f"{alias}: {text}", "check that sshd runs on the node and the address is right"
    )


def connect(
    alias: str, settings: SshSettings, on_unreachable: Callable[[str, str], None] | None = None
) -> SshConnection:
    """Connect and authenticate to one node; host key checked before any authentication."""
    import paramiko

    target = resolve_target(alias, settings)
    quiet_paramiko()
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(refusing_policy(alias, str(settings.known_hosts)))
    if settings.system_known_hosts_path and os.path.isfile(settings.system_known_hosts_path):
        client.load_system_host_keys(settings.system_known_hosts_path)
    if settings.known_hosts.is_file():
        # loaded as "system" keys: paramiko never writes those back, so known_hosts stays ours
        client.load_system_host_keys(str(settings.known_hosts))
    t0 = time.monotonic()
    sock = open_socket(target, settings.connect_timeout_s)
    t = settings.connect_timeout_s
    try:
        client.connect(
            target.hostname,
            port=target.port,
            username=target.user,
            # paramiko takes a list here too (its docstring); types-paramiko says str only
            key_filename=list(target.identity_files) or None,  # type: ignore[arg-type]
            timeout=t,
            banner_timeout=t,
            auth_timeout=t,
            channel_timeout=t,
            allow_agent=settings.allow_agent,
            look_for_keys=not target.identity_files,
            sock=sock,
        )
    except SshError:
        client.close()
        raise
    except paramiko.BadHostKeyException as err:
        client.close()
        raise HostKeyChangedError(
            alias,
            sha256_fingerprint(err.key),
            sha256_fingerprint(err.expected_key),
            str(settings.known_hosts),
        ) from None
    except paramiko.AuthenticationException as err:
        client.close()
        raise SshAuthError(
            alias,
            f"{alias}: authentication as {target.user} failed ({err})",
            "check User/IdentityFile in ~/.ssh/config, or the key in the node's authorized_keys",
        ) from None
    except (TimeoutError, EOFError, paramiko.SSHException, OSError) as err:
        client.close()
        raise _handshake_error(alias, target, err, time.monotonic() - t0, t) from None
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(settings.keepalive_s)
    return SshConnection(target, client, settings, on_unreachable)


class LocalRunner(HelperCalls):
    """This machine, with the same interface as an SSH connection (no shell involved at all)."""

    runs_here = True

    def __init__(
        self, host: str = "localhost", python: str = sys.executable, command_timeout_s: float = 120.0
    ):
        self.host = host
        self.python = python
        self._timeout = command_timeout_s

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float | None = None,
        stdin_data: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        build_command(argv, env)  # same validation as over SSH, so behaviour never differs
        timeout = self._timeout if timeout is None else timeout
        started, t0 = time.time(), time.monotonic()
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        try:
            out, err = proc.communicate(stdin_data or "", timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group is exactly what we started
            proc.communicate()
            raise CommandTimeoutError(
                self.host, f"{self.host}: {argv[0]} did not finish within {timeout:g} s"
            ) from None
        return CommandResult(
            host=self.host,
            argv=tuple(argv),
            exit_status=proc.returncode,
            stdout=out,
            stderr=err,
            seconds=time.monotonic() - t0,
            started_at=started,
        )

    def open(self, argv: Sequence[str]) -> NodeStream:
        build_command(argv)
        return PipeStream(
            subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
            )
        )
