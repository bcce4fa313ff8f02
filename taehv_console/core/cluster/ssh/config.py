"""How the console reaches a node: its SSH settings, an alias resolved through ~/.ssh/config, and
the socket (or ProxyCommand) that connects to where the alias goes."""

from __future__ import annotations

import getpass
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taehv_console.core.cluster.hosts import InvalidHostError, validate_host
from taehv_console.core.cluster.ssh.errors import SshConfigError, SshConnectError, SshTimeoutError

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
        validate_host(hostname)
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


def open_socket(target: HostTarget, timeout: float) -> socket.socket | paramiko.ProxyCommand:
    """A TCP connection to the target, or its ProxyCommand started; nothing SSH spoken yet."""
    import paramiko

    if target.proxy_command:
        return paramiko.ProxyCommand(target.proxy_command)
    try:
        return socket.create_connection((target.hostname, target.port), timeout=timeout)
    except TimeoutError:
        raise SshTimeoutError(
            target.alias,
            f"{target.alias}: no TCP connection to {target.hostname}:{target.port} within {timeout:g} s",
            "check the address, the port and firewalls",
        ) from None
    except OSError as err:
        raise SshConnectError(
            target.alias,
            f"{target.alias}: cannot connect to {target.hostname}:{target.port}: {err.strerror or err}",
            "check that the node is up and sshd listens on that address",
        ) from None


def master_address(first_host: str, settings: SshSettings) -> str:
    """The address the other nodes reach node 0's rendezvous at: its HostName from the ssh
    config (an alias means nothing to torch's rendezvous), or the host itself when local."""
    if first_host in ("localhost", "127.0.0.1"):
        return first_host
    return resolve_target(first_host, settings).hostname
