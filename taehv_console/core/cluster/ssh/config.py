"""How the console reaches a node: its SSH settings, an alias resolved through ~/.ssh/config, and
the socket (or ProxyCommand) that connects to where the alias goes."""

from __future__ import annotations

import getpass
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taehv_console.core.cluster.hosts import InvalidHostError, validate_host
from taehv_console.core.cluster.ssh.errors import SshConfigError, SshConnectError, SshTimeoutError
from taehv_console.core.hostnames import host_port

if TYPE_CHECKING:
    import paramiko


def _env_path(env: Mapping[str, str], name: str, default: str) -> str:
    return os.path.expanduser(env.get(name) or default)


@dataclass(frozen=True)
class SshSettings:
    """How the console reaches nodes. Paths default to ~/.ssh and can be moved by environment
    (TAEHV_SSH_CONFIG, TAEHV_KNOWN_HOSTS, TAEHV_REMOTE_PYTHON) or by argument, as tests do."""

    config_path: str = "~/.ssh/config"
    known_hosts_path: str = "~/.ssh/known_hosts"
    # Read but never written: where admins put cluster-wide host keys. None skips it.
    system_known_hosts_path: str | None = "/etc/ssh/ssh_known_hosts"
    connect_timeout_s: float = 10.0
    command_timeout_s: float = 120.0
    # A connected sshd answers a channel open or an exec within milliseconds; one that has not
    # in this long is frozen or cut off (the follow loop asks every few seconds).
    answer_timeout_s: float = 5.0
    retry_unreachable_s: float = 5.0  # how often the pool tries to reach an unreachable node again
    keepalive_s: int = 15
    max_parallel: int = 64
    user: str | None = None
    identity_file: str | None = None
    allow_agent: bool = True  # use a running agent to authenticate; it is never forwarded
    # The interpreter that runs the project's modules on the nodes. The console's own by default:
    # clusters usually share one environment path (NFS or one image) across nodes.
    python: str = sys.executable

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> SshSettings:
        env = os.environ if env is None else env
        base = cls(
            config_path=_env_path(env, "TAEHV_SSH_CONFIG", "~/.ssh/config"),
            known_hosts_path=_env_path(env, "TAEHV_KNOWN_HOSTS", "~/.ssh/known_hosts"),
            python=env.get("TAEHV_REMOTE_PYTHON") or sys.executable,
        )
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def known_hosts(self) -> Path:
        return Path(os.path.expanduser(self.known_hosts_path))

    @property
    def config(self) -> Path:
        return Path(os.path.expanduser(self.config_path))


@dataclass(frozen=True)
class HostTarget:
    """Where an alias really goes, after ~/.ssh/config. `known_name` is its known_hosts key."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    proxy_command: str | None = None

    @property
    def known_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def resolve_target(alias: str, settings: SshSettings) -> HostTarget:
    """Apply ~/.ssh/config (HostName, Port, User, IdentityFile, ProxyCommand) to an alias."""
    import paramiko

    validate_host(alias)
    cfg: dict[str, Any] = {}
    if settings.config.is_file():
        try:
            cfg = paramiko.SSHConfig.from_path(str(settings.config)).lookup(alias)
        except Exception as err:  # noqa: BLE001 - paramiko raises several kinds for a bad file
            raise SshConfigError(
                alias,
                f"{settings.config}: cannot be read ({err})",
                "fix the file or point TAEHV_SSH_CONFIG at another",
            ) from None
    if cfg.get("proxyjump"):
        raise SshConfigError(
            alias,
            f"{alias}: ProxyJump in {settings.config} is not supported",
            f"write it as: ProxyCommand ssh -W %h:%p {cfg['proxyjump']}",
        )
    hostname = cfg.get("hostname", alias)
    try:
        hostname = validate_host(hostname)  # '[::1]' is the address ::1
    except InvalidHostError as err:
        raise SshConfigError(alias, f"{settings.config}: HostName for {alias}: {err}") from None
    try:
        port = int(cfg.get("port", 22))
    except ValueError:
        raise SshConfigError(alias, f"{settings.config}: Port for {alias} is not a number") from None
    user = cfg.get("user") or settings.user or _local_user()
    files = tuple(os.path.expanduser(f) for f in cfg.get("identityfile", ()))
    if settings.identity_file:
        files = (os.path.expanduser(settings.identity_file),) + files
    return HostTarget(
        alias=alias,
        hostname=hostname,
        port=port,
        user=user,
        identity_files=tuple(f for f in files if os.path.exists(f)),
        proxy_command=cfg.get("proxycommand") or None,
    )


def _local_user() -> str:
    return getpass.getuser()


# Name lookups run on threads of their own, because getaddrinfo cannot be interrupted: the pool's
# worker waits for one no longer than its connection's deadline and then gives up on it. A lookup
# given up on keeps its (daemon) thread until the resolver answers (seconds, for a name no server
# knows), so at most _LOOKUP_THREADS run at once: past that a lookup waits for a slot, still within
# its own deadline, and the process never waits for them at exit.
_LOOKUP_THREADS = 128
_lookup_slots = threading.BoundedSemaphore(_LOOKUP_THREADS)


def resolve_address(alias: str, hostname: str, port: int, timeout: float) -> list[tuple[Any, ...]]:
    """getaddrinfo(hostname, port) for a TCP connection, answered within `timeout` seconds or an
    SshTimeoutError naming the lookup (an address literal answers at once, with no lookup)."""
    try:  # an address (IPv4 or IPv6 literal): no resolver involved
        return socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        pass
    deadline = time.monotonic() + timeout
    answer: list[Any] = []
    done = threading.Event()

    def lookup() -> None:
        try:
            answer.append(socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM))
        except OSError as err:
            answer.append(err)
        finally:
            _lookup_slots.release()
            done.set()

    if _lookup_slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
        threading.Thread(target=lookup, name=f"taehv-lookup-{hostname}", daemon=True).start()
        done.wait(max(0.0, deadline - time.monotonic()))
    if not answer:
        raise SshTimeoutError(
            alias,
            f"{alias}: the name {hostname} did not resolve within {timeout:g} s",
            "check the name (hostfile, ~/.ssh/config HostName) and the DNS servers; or give an address",
        )
    if isinstance(answer[0], OSError):
        err = answer[0]
        raise SshConnectError(
            alias,
            f"{alias}: cannot connect to {host_port(hostname, port)}: the name does not resolve "
            f"({err.strerror or err})",
            "check the name in the hostfile or ~/.ssh/config (HostName), or give an address",
        )
    return list(answer[0])


def open_socket(target: HostTarget, timeout: float) -> socket.socket | paramiko.ProxyCommand:
    """A TCP connection to the target, or its ProxyCommand started; nothing SSH spoken yet. The
    name's lookup and the connection share one deadline, `timeout` seconds from now."""
    import paramiko

    if target.proxy_command:
        return paramiko.ProxyCommand(target.proxy_command)
    deadline = time.monotonic() + timeout
    where = host_port(target.hostname, target.port)
    addresses = resolve_address(target.alias, target.hostname, target.port, timeout)
    error: OSError | None = None
    for family, kind, proto, _name, address in addresses:  # as socket.create_connection does
        left = deadline - time.monotonic()
        if left <= 0:
            error = TimeoutError()
            break
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left)
            sock.connect(address)  # the socket keeps a timeout, as create_connection's did
            return sock
        except OSError as err:
            sock.close()
            error = err
    if isinstance(error, TimeoutError):
        raise SshTimeoutError(
            target.alias,
            f"{target.alias}: no TCP connection to {where} within {timeout:g} s",
            "check the address, the port and firewalls",
        )
    detail = (error.strerror or str(error)) if error is not None else "no address"
    raise SshConnectError(
        target.alias,
        f"{target.alias}: cannot connect to {where}: {detail}",
        "check that the node is up and sshd listens on that address",
    )


def quiet_paramiko() -> None:
    """Keep paramiko's log off the terminal. Its transport thread logs a failed handshake with a
    30-line traceback at ERROR, which Python prints to stderr when no handler is configured; the
    console reports the same failure as one line (runners._handshake_error). A handler someone configured
    on the "paramiko" logger on purpose is left alone."""
    log = logging.getLogger("paramiko")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
        log.propagate = False


def master_address(first_host: str, settings: SshSettings) -> str:
    """The address the other nodes reach node 0's rendezvous at: its HostName from the ssh
    config (an alias means nothing to torch's rendezvous), or the host itself when local."""
    if first_host in ("localhost", "127.0.0.1"):
        return first_host
    return resolve_target(first_host, settings).hostname
