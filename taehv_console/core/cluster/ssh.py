"""Commands on the nodes: SSH through paramiko, or directly for this machine, behind one interface.

Safety rules kept here so no caller can forget them: host names are validated before anything
connects; unknown or changed host keys are refused (RejectPolicy, known_hosts loaded explicitly,
`trust` is the only way in); commands are argv lists joined with shlex.join (a value never reaches
the remote shell unquoted); no agent forwarding; connect, banner, auth and command timeouts;
transport keepalive; fan-out over a bounded thread pool so 64 nodes are one round, not 64.

Every remote call has a deadline, including the steps paramiko would wait on forever (a channel
open or exec request a frozen sshd never answers): past `answer_timeout_s` the connection is
dropped and the node reported unreachable; the pool then answers "unreachable" at once for that
node while it reconnects in the background, so a hung node costs one deadline, not one per poll.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import json
import os
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from taehv_console.core.cluster.hosts import InvalidHostError, is_local_host, validate_host
from taehv_console.core.cluster.nodecall import (
    ChannelStream,
    Failure,
    NodeCallError,
    NodeReply,
    NodeStream,
    PipeStream,
    SshError,
    fix_for_exit,
    helper_name,
    parse_reply,
)
from taehv_console.core.models import CommandResult

if TYPE_CHECKING:  # 3.10 has no typing.Self
    from typing_extensions import Self

T = TypeVar("T")
SPAWN = "taehv_console.core.cluster.spawn"
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# ---------------------------------------------------------------------------------------- errors


class HostKeyUnknownError(SshError):
    def __init__(self, host: str, known_name: str, key_type: str, fingerprint: str, known_hosts: str):
        super().__init__(
            host,
            f"{host}: host key not in {known_hosts} ({key_type} {fingerprint}); refused, nothing was run",
            f"check the fingerprint with the node's admin, then run: taehv-console trust {host}",
        )
        self.known_name = known_name
        self.key_type = key_type
        self.fingerprint = fingerprint


class HostKeyChangedError(SshError):
    def __init__(self, host: str, fingerprint: str, expected: str, known_hosts: str):
        super().__init__(
            host,
            f"{host}: HOST KEY CHANGED (now {fingerprint}, {known_hosts} has {expected}); refused, "
            "nothing was run: the node was reinstalled, or someone is in the middle",
            f"if the change is expected, run: taehv-console trust --replace {host}",
        )
        self.fingerprint = fingerprint
        self.expected = expected


class SshAuthError(SshError):
    pass


class SshConnectError(SshError):
    pass


class SshTimeoutError(SshError):
    pass


class SshUnreachableError(SshTimeoutError):
    """A node that stopped answering on a connection that was working (frozen, overloaded, cut)."""


class CommandTimeoutError(SshError):
    pass


class SshConfigError(SshError):
    pass


class CommandError(ValueError):
    """An argv that cannot be sent safely (empty, not strings, a NUL or line break in a value)."""


# -------------------------------------------------------------------------------------- settings


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


# ------------------------------------------------------------------------------------ host keys


def sha256_fingerprint(key: Any) -> str:
    """OpenSSH's form: SHA256:<base64 of the key blob's SHA-256, no padding>."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _open_socket(target: HostTarget, timeout: float) -> Any:
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


def fetch_host_key(alias: str, settings: SshSettings) -> tuple[HostTarget, Any]:
    """The key the host presents, fetched without authenticating (for `trust`)."""
    import paramiko

    target = resolve_target(alias, settings)
    sock = _open_socket(target, settings.connect_timeout_s)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = settings.connect_timeout_s
        transport.start_client(timeout=settings.connect_timeout_s)
        return target, transport.get_remote_server_key()
    except paramiko.SSHException as err:
        raise SshConnectError(alias, f"{alias}: SSH handshake failed: {err}") from None
    finally:
        transport.close()


def known_keys(settings: SshSettings, known_name: str) -> dict[str, Any]:
    """Key type → key that known_hosts (user's, then system's) holds for a host."""
    import paramiko

    out: dict[str, Any] = {}
    for path in (settings.system_known_hosts_path, str(settings.known_hosts)):
        if path and os.path.isfile(os.path.expanduser(path)):
            keys = paramiko.HostKeys(os.path.expanduser(path)).lookup(known_name)
            if keys:
                out.update({t: keys[t] for t in keys})
    return out


def add_known_host(path: str | Path, known_name: str, key: Any, *, replace: bool = False) -> None:
    """Append `known_name keytype base64` to known_hosts; with replace, drop the host's old lines
    first (hashed ones too). Other lines, comments included, are kept as they were."""
    import paramiko

    path = Path(os.path.expanduser(str(path)))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    if replace:
        lines = [ln for ln in lines if not _line_names_host(ln, known_name, paramiko)]
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines.append(f"{known_name} {key.get_name()} {key.get_base64()}\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(lines))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)  # a crash mid-write must not leave a truncated known_hosts


def _line_names_host(line: str, known_name: str, paramiko: Any) -> bool:
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return False
    for name in fields[0].split(","):
        if name.startswith("|1|"):
            if paramiko.HostKeys.hash_host(known_name, name) == name:
                return True
        elif name == known_name:
            return True
    return False


# ------------------------------------------------------------------------------------- commands


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


class _HelperCalls:
    """The one way to run a project helper on the node (`call`), and the process-group helpers
    built on it; shared by both runners, so SSH and this machine behave the same."""

    host: str
    python: str
    runs_here = False

    def run(self, argv: Sequence[str], **kw: Any) -> CommandResult:  # pragma: no cover - overridden
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
        return DetachedProcess(host=self.host, pid=int(out["pid"]), pgid=int(out["pgid"]), log=out["log"])

    def signal_group(self, pgid: int, sig: str = "TERM", *, timeout: float | None = 30) -> bool:
        """Signal a process group on the node; False when the group no longer exists."""
        reply = self.call(SPAWN, ["signal", "--pgid", str(int(pgid)), "--signal", sig], timeout=timeout)
        return bool(reply.value().get("sent"))

    def group_pids(self, pgid: int, *, timeout: float | None = 30) -> tuple[int, ...]:
        """Live processes of a process group on the node (empty once everything has exited)."""
        reply = self.call(SPAWN, ["pids", "--pgid", str(int(pgid))], timeout=timeout, require=("pids",))
        return tuple(int(p) for p in reply.value()["pids"])


class SshConnection(_HelperCalls):
    """One authenticated SSH connection to a node. Channels may be opened from several threads."""

    def __init__(
        self,
        target: HostTarget,
        client: Any,
        settings: SshSettings,
        on_unreachable: Callable[[str, str], None] | None = None,
    ):
        self.target = target
        self.host = target.alias
        self.python = settings.python
        self._client = client
        self._settings = settings
        self._on_unreachable = on_unreachable  # the pool's: remember the node is down

    def _channel(self, command: str, deadline: float | None = None) -> Any:
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

    def _unreachable(self, why: str) -> None:
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


def _refusing_policy(alias: str, known_hosts: str) -> Any:
    """paramiko's RejectPolicy, raising an error that carries the fingerprint and the fix."""
    import paramiko

    class RefuseUnknownHost(paramiko.RejectPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            raise HostKeyUnknownError(alias, hostname, key.get_name(), sha256_fingerprint(key), known_hosts)

    return RefuseUnknownHost()


def connect(
    alias: str, settings: SshSettings, on_unreachable: Callable[[str, str], None] | None = None
) -> SshConnection:
    """Connect and authenticate to one node; host key checked before any authentication."""
    import paramiko

    target = resolve_target(alias, settings)
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(_refusing_policy(alias, str(settings.known_hosts)))
    if settings.system_known_hosts_path and os.path.isfile(settings.system_known_hosts_path):
        client.load_system_host_keys(settings.system_known_hosts_path)
    if settings.known_hosts.is_file():
        # loaded as "system" keys: paramiko never writes those back, so known_hosts stays ours
        client.load_system_host_keys(str(settings.known_hosts))
    t0 = time.monotonic()
    sock = _open_socket(target, settings.connect_timeout_s)
    t = settings.connect_timeout_s
    try:
        client.connect(
            target.hostname,
            port=target.port,
            username=target.user,
            key_filename=list(target.identity_files) or None,
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
    except (TimeoutError, EOFError) as err:
        client.close()
        raise SshTimeoutError(
            alias,
            f"{alias}: no SSH handshake within {t:g} s ({type(err).__name__})",
            "the port answers but sshd does not: check the node's sshd and load",
        ) from None
    except (paramiko.SSHException, OSError) as err:
        client.close()
        text = str(err) or type(err).__name__
        # A port that accepts TCP but never speaks SSH surfaces as a banner error or, when the
        # transport thread died first, as paramiko's "No existing session": say what happened.
        if time.monotonic() - t0 >= 0.9 * t or "banner" in text.lower() or "timeout" in text.lower():
            raise SshTimeoutError(
                alias,
                f"{alias}: no SSH handshake within {t:g} s: {target.hostname}:"
                f"{target.port} accepts TCP but no SSH server answered ({text})",
                "check sshd on the node (wedged, overloaded) or what else holds the port",
            ) from None
        raise SshConnectError(
            alias, f"{alias}: {text}", "check that sshd runs on the node and the address is right"
        ) from None
    transport = client.get_transport()
    if transport is not None:
        transport.set_keepalive(settings.keepalive_s)
    return SshConnection(target, client, settings, on_unreachable)


# ----------------------------------------------------------------------------------------- local


class LocalRunner(_HelperCalls):
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


# ----------------------------------------------------------------------------------------- pool


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
            transport = conn._client.get_transport() if conn else None
            if conn is None or transport is None or not transport.is_active():
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
