"""Nodes that cannot be reached, as real sockets and a real resolver present them (issue 44): a
name that does not resolve costs at most the connect timeout, its lookup included, so N such hosts
take about N x timeout / parallel; a port that accepts TCP and says nothing, or closes at once, is
one line that says what happened and how long it took, with no paramiko traceback on stderr."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from taehv_console.cli import main
from taehv_console.core.cluster.gather import probe_hosts
from taehv_console.core.cluster.ssh import SshPool, SshSettings
from taehv_console.core.cluster.ssh import config as ssh_config
from taehv_console.exit_codes import ExitCode

pytestmark = pytest.mark.timeout(120)


def _settings(tmp_path: Path, timeout: float, parallel: int = 64) -> SshSettings:
    return SshSettings(
        config_path=str(tmp_path / "no-ssh-config"),
        known_hosts_path=str(tmp_path / "known_hosts"),
        system_known_hosts_path=None,
        connect_timeout_s=timeout,
        max_parallel=parallel,
        allow_agent=False,
    )


class Listener:
    """A loopback port that accepts every connection and then either holds it without a word
    ("silent", a wedged sshd or a blackholing middlebox) or closes it at once ("close")."""

    def __init__(self, mode: str):
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.mode == "close":
                conn.close()
            else:
                self.held.append(conn)

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def listener(request) -> Iterator[Listener]:
    server = Listener(request.param)
    try:
        yield server
    finally:
        server.close()


def _ssh_config(tmp_path: Path, alias: str, port: int) -> SshSettings:
    path = tmp_path / "ssh-config"
    path.write_text(f"Host {alias}\n  HostName 127.0.0.1\n  Port {port}\n")
    return SshSettings(
        config_path=str(path),
        known_hosts_path=str(tmp_path / "known_hosts"),
        system_known_hosts_path=None,
        connect_timeout_s=1.0,
        allow_agent=False,
    )


def _silent_said(error: str, elapsed: float, port: int) -> None:
    assert "no SSH handshake within 1 s" in error and f"127.0.0.1:{port}" in error
    assert "No existing session" not in error  # paramiko's words, not what happened
    assert 0.9 <= elapsed < 1.0 + 5


def _closed_said(error: str, elapsed: float, port: int) -> None:
    assert elapsed < 0.9  # it did not wait for the timeout ...
    assert "within" not in error  # ... so it does not say it did
    assert "closed the connection after" in error and "without an SSH banner" in error


@pytest.mark.parametrize(
    ("listener", "alias", "said"),
    [("silent", "quiet-node", _silent_said), ("close", "closing-node", _closed_said)],
    ids=["accepts-tcp-and-says-nothing", "closes-at-once"],
    indirect=["listener"],
)
def test_a_port_without_an_ssh_banner_is_one_line_that_says_what_happened_and_how_long(
    listener, alias, said, tmp_path, capfd
):
    """A port that accepts TCP and says nothing is named with the timeout it waited; one that closes
    at once is said so with the time it took, never as a wait it did not make."""
    settings = _ssh_config(tmp_path, alias, listener.port)
    with SshPool(settings) as pool:
        t0 = time.monotonic()
        (result,) = probe_hosts([alias], pool)
        elapsed = time.monotonic() - t0
    assert not result.ok and result.fix
    said(result.error, elapsed, listener.port)
    time.sleep(0.3)  # paramiko's transport thread logs its failure after connect returned
    err = capfd.readouterr().err
    assert "Traceback" not in err and "paramiko" not in err, err


@pytest.mark.parametrize("listener", ["close"], indirect=True)
def test_trust_of_a_port_that_closes_at_once_prints_no_traceback(listener, tmp_path, capfd, monkeypatch):
    settings = _ssh_config(tmp_path, "closing-node", listener.port)
    monkeypatch.setenv("TAEHV_CRASH_DIR", str(tmp_path / "crashes"))
    code = main(
        [
            "trust",
            "closing-node",
            "--ssh-config",
            settings.config_path,
            "--known-hosts",
            settings.known_hosts_path,
        ]
    )
    time.sleep(0.3)
    err = capfd.readouterr().err
    assert code == ExitCode.FAILED and "Traceback" not in err, err
    assert not (tmp_path / "crashes").exists()


def test_names_that_never_resolve_cost_one_connect_timeout_each_in_parallel(tmp_path, monkeypatch):
    """A resolver that takes 5 s per unknown name (a DNS server that drops the query): the lookup
    is given up on at the connect timeout, inside the pool, so 200 hosts at 0.2 s with 32 at once
    take about 200 x 0.2 / 32 = 1.25 s. Before, each lookup took the resolver's 5 s in its worker:
    200 x 5 / 32 = 31 s."""
    real = socket.getaddrinfo

    def slow(host, *args, **kw):
        if str(host).endswith(".invalid") and not kw.get("flags", 0) & socket.AI_NUMERICHOST:
            time.sleep(5)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    hosts = [f"node{i}.invalid" for i in range(200)]
    with SshPool(_settings(tmp_path, 0.2, parallel=32)) as pool:
        t0 = time.monotonic()
        results = probe_hosts(hosts, pool)
        elapsed = time.monotonic() - t0
    assert all(not r.ok for r in results)
    assert all("did not resolve within 0.2 s" in r.error for r in results), results[0].error
    assert elapsed < 4 * (200 * 0.2 / 32) + 2, elapsed  # a generous factor over the bound


def test_a_refused_answer_from_the_resolver_is_named_as_the_name(tmp_path):
    with SshPool(_settings(tmp_path, 5.0)) as pool:
        (result,) = probe_hosts(["no-such-node.invalid"], pool)
    assert not result.ok
    # the real resolver: NXDOMAIN at once, or (a resolver that drops the query) the deadline
    assert "does not resolve" in result.error or "did not resolve within 5 s" in result.error


def test_an_address_literal_needs_no_lookup(tmp_path, monkeypatch):
    calls: list[str] = []
    real = socket.getaddrinfo

    def counting(host, *args, **kw):
        if not kw.get("flags", 0) & socket.AI_NUMERICHOST:
            calls.append(str(host))
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", counting)
    assert ssh_config.resolve_address("n", "127.0.0.1", 22, 0.5)[0][4] == ("127.0.0.1", 22)
    assert ssh_config.resolve_address("n", "::1", 22, 0.5)[0][4][:2] == ("::1", 22)
    assert calls == []


def test_detect_over_many_unresolvable_hosts_is_bounded_by_the_connect_timeout(tmp_path, capsys, monkeypatch):
    """The command as a user runs it, on the real resolver: 300 hosts at 0.1 s, 64 at once."""
    monkeypatch.setenv("TAEHV_CRASH_DIR", str(tmp_path / "crashes"))
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"h{i}.invalid slots=1\n" for i in range(300)))
    t0 = time.monotonic()
    code = main(
        [
            "detect",
            "--hosts",
            str(hostfile),
            "--connect-timeout",
            "0.1",
            "--parallel",
            "64",
            "--json",
            "--ssh-config",
            str(tmp_path / "none"),
            "--known-hosts",
            str(tmp_path / "kh"),
        ]
    )
    elapsed = time.monotonic() - t0
    out = json.loads(capsys.readouterr().out)
    assert code == ExitCode.FAILED and len(out["nodes"]) == 300
    assert all("resolve" in n["error"] for n in out["nodes"]), out["nodes"][0]
    assert elapsed < 5 * (300 * 0.1 / 64) + 3, elapsed


@pytest.mark.parametrize("listener", ["close", "silent"], indirect=True)
def test_the_command_prints_no_paramiko_traceback(listener, tmp_path):
    """In a process of its own, as a user runs it: pytest's log capture would hide what Python's
    last-resort handler prints when no handler is configured."""
    settings = _ssh_config(tmp_path, "odd-node", listener.port)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("odd-node slots=1\n")
    argv = [
        "detect",
        "--hosts",
        str(hostfile),
        "--connect-timeout",
        "1",
        "--ssh-config",
        settings.config_path,
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "taehv_console.cli", *argv, "--known-hosts", settings.known_hosts_path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == ExitCode.FAILED, proc.stderr
    assert "Traceback" not in proc.stderr and "paramiko" not in proc.stderr, proc.stderr
    assert "odd-node" in proc.stdout
