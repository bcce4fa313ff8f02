"""Shared fixtures. The main one is a real OpenSSH server on loopback addresses, so SSH code is
tested against sshd itself (host keys, auth, quoting by a real login shell), not a mock.

Fixture API (session-scoped, started on first use, stopped at the end of the session):

    sshd        -> LoopbackSshd: the server; .hosts, .port, .user, .key_path, .known_hosts,
                   .ssh_config, .settings(**overrides) -> SshSettings, .env() -> dict of
                   TAEHV_SSH_CONFIG/TAEHV_KNOWN_HOSTS/TAEHV_REMOTE_PYTHON for CLI subprocesses,
                   .write_hostfile(path, slots=..., hosts=...) -> Path
    sshd_hosts  -> list[SshdHost]: one per address (127.0.0.2, 127.0.0.3, ...), each with
                   .host (the address), .alias (an ssh-config alias, tnode2 ...), .port, .user,
                   .key_path, .known_hosts, .ssh_config

Every address accepts the same client key (`key_path`) for the current user; `known_hosts` holds
the server's key for each `[address]:port`, and `ssh_config` maps both addresses and aliases to
port, user and key. Nothing in ~/.ssh is read or written. Remote commands run as the current user
with this machine's filesystem, so "remote" python is this venv's python.

Benchmarks reuse the server without pytest: load this file with importlib and call
`LoopbackSshd(workdir, n_hosts).start()`.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")

# Every console a test starts (in-process or as a CLI process, which inherits this) starts no
# detached supervisor: most tests are about one console, and a supervisor would outlive them. The
# supervisor's own tests turn it on for their runs (tests/e2e/test_supervisor.py).
os.environ.setdefault("TAEHV_SUPERVISOR", "off")


@dataclass(frozen=True)
class SshdHost:
    host: str
    alias: str
    port: int
    user: str
    key_path: str
    known_hosts: str
    ssh_config: str


def find_sshd() -> str | None:
    for c in SSHD_CANDIDATES:
        if os.access(c, os.X_OK):
            return c
    return shutil.which("sshd")


def _port_free_on(addresses: list[str]) -> int:
    # The same port on every address keeps ssh_config to one block; retried if any address has it.
    for _ in range(50):
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = s.getsockname()[1]
        try:
            for a in addresses[1:]:
                with socket.socket() as s:
                    s.bind((a, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no TCP port free on all loopback addresses")


class LoopbackSshd:
    """sshd listening on 127.0.0.<first> ... 127.0.0.<first+n-1>, one port, its own keys."""

    def __init__(self, workdir: str | Path, n_hosts: int = 4, first: int = 2):
        self.dir = Path(workdir)
        self.addresses = [f"127.0.0.{first + i}" for i in range(n_hosts)]
        self.user = getpass.getuser()
        self.key_path = str(self.dir / "client_ed25519")
        self.host_key_path = str(self.dir / "ssh_host_ed25519_key")
        self.known_hosts = str(self.dir / "known_hosts")
        self.ssh_config = str(self.dir / "ssh_config")
        self.log_path = self.dir / "sshd.log"
        self.port = 0
        self.hosts: list[SshdHost] = []
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20.0, port: int | None = None) -> LoopbackSshd:
        """`port`: listen there (a test that replaces one server by another on the same
        address and port); default a port free on every address."""
        sshd = find_sshd()
        if sshd is None:
            raise RuntimeError("sshd not found: install openssh-server (.ci/run does)")
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in (self.host_key_path, self.key_path):
            if not os.path.exists(path):
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "taehv-test", "-f", path],
                    check=True,
                )
        shutil.copy(self.key_path + ".pub", self.dir / "authorized_keys")
        if os.geteuid() == 0:
            # sshd's privilege separation needs this directory; it is root's to create.
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.port = port or _port_free_on(self.addresses)
        config = self.dir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    *(f"ListenAddress {a}:{self.port}" for a in self.addresses),
                    f"HostKey {self.host_key_path}",
                    f"PidFile {self.dir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PermitRootLogin prohibit-password",
                    "AllowAgentForwarding no",
                    "AllowTcpForwarding no",
                    "X11Forwarding no",
                    "PrintMotd no",
                    # All test hosts share this one daemon: the default 10:30:100 would drop connections
                    # at random once a fan-out opens more than 10 handshakes at once.
                    "MaxStartups 500",
                    "MaxSessions 100",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )
        check = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True, text=True)
        if check.returncode:
            raise RuntimeError(f"sshd rejects the test config: {check.stderr}")
        log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
        )
        log.close()
        host_pub = Path(self.host_key_path + ".pub").read_text().split()
        Path(self.known_hosts).write_text(
            "".join(f"[{a}]:{self.port} {host_pub[0]} {host_pub[1]}\n" for a in self.addresses)
        )
        blocks = [f"Host tnode{a.rsplit('.', 1)[1]}\n  HostName {a}\n" for a in self.addresses]
        blocks.append(
            "Host 127.0.0.* tnode*\n"
            f"  Port {self.port}\n  User {self.user}\n  IdentityFile {self.key_path}\n  IdentitiesOnly yes\n"
        )
        Path(self.ssh_config).write_text("\n".join(blocks))
        self.hosts = [
            SshdHost(
                host=a,
                alias=f"tnode{a.rsplit('.', 1)[1]}",
                port=self.port,
                user=self.user,
                key_path=self.key_path,
                known_hosts=self.known_hosts,
                ssh_config=self.ssh_config,
            )
            for a in self.addresses
        ]
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(self.addresses)
        while pending:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(
                    f"sshd exited with {self._proc.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            a = pending[0]
            try:
                with socket.create_connection((a, self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        pending.pop(0)
                        continue
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sshd did not answer on {a}:{self.port} within {timeout} s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()  # the daemon we started, by its own pid
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def settings(self, **overrides):
        """SshSettings pointing at this server's files only (no ~/.ssh, no system known_hosts)."""
        from taehv_console.core.cluster.ssh import SshSettings

        base = {
            "config_path": self.ssh_config,
            "known_hosts_path": self.known_hosts,
            "system_known_hosts_path": None,
            "connect_timeout_s": 10.0,
            "command_timeout_s": 60.0,
            "allow_agent": False,
            "python": sys.executable,
        }
        base.update(overrides)
        return SshSettings(**base)

    def env(self) -> dict[str, str]:
        """Variables that point a `taehv-console` subprocess at this server."""
        return {
            "TAEHV_SSH_CONFIG": self.ssh_config,
            "TAEHV_KNOWN_HOSTS": self.known_hosts,
            "TAEHV_REMOTE_PYTHON": sys.executable,
        }

    def write_hostfile(self, path: str | Path, slots: int | None = 1, hosts: list[str] | None = None) -> Path:
        path = Path(path)
        hosts = hosts or self.addresses
        path.write_text("".join(f"{h} slots={slots}\n" if slots else f"{h}\n" for h in hosts))
        return path


@pytest.fixture(scope="session")
def sshd():
    if find_sshd() is None:
        if os.environ.get("CI"):
            pytest.fail("sshd is missing on CI: .ci/run should have installed openssh-server")
        pytest.skip("sshd not installed (apt-get install openssh-server)")
    workdir = tempfile.mkdtemp(prefix="taehv-sshd-")
    server = LoopbackSshd(workdir, n_hosts=4).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def sshd_hosts(sshd):
    return list(sshd.hosts)
