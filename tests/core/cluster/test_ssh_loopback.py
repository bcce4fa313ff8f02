"""The SSH layer against a real OpenSSH server on loopback addresses (tests/conftest.py `sshd`):
parallel probes, host-key refusal, quoting through a real login shell, injection attempts,
unreachable nodes, timeouts and detached processes."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from taehv_console.core.cluster.gather import probe_hosts
from taehv_console.core.cluster.hosts import InvalidHostError
from taehv_console.core.cluster.spawn import group_pids
from taehv_console.core.cluster.ssh import (
    CommandError,
    CommandTimeoutError,
    HostKeyChangedError,
    HostKeyUnknownError,
    SshPool,
    add_known_host,
    connect,
    fetch_host_key,
    sha256_fingerprint,
)


def test_probe_of_every_host_in_parallel_reports_facts(sshd, sshd_hosts, tmp_path):
    with SshPool(sshd.settings()) as pool:
        t0 = time.monotonic()
        results = probe_hosts([h.host for h in sshd_hosts], pool, {"runs": str(tmp_path)})
        elapsed = time.monotonic() - t0
    assert [r.host for r in results] == [h.host for h in sshd_hosts]
    assert all(r.ok for r in results), [r.error for r in results]
    assert all(r.facts.path("runs").exists and r.facts.python_version for r in results)
    assert all(abs(r.clock_offset_s) < 2 for r in results)  # same machine: no skew
    # One round: the wall time is far below the sum of the per-host times.
    assert elapsed < sum(r.seconds for r in results) + 5


def test_ssh_config_alias_resolves_to_address_port_and_key(sshd, sshd_hosts):
    h = sshd_hosts[1]
    with SshPool(sshd.settings()) as pool:
        conn = pool.connection(h.alias)
        assert (conn.target.hostname, conn.target.port) == (h.host, h.port)
        assert conn.target.identity_files == (h.key_path,)
        assert conn.run(["true"]).ok


def test_values_reach_the_remote_command_literally(sshd, sshd_hosts, tmp_path):
    marker = tmp_path / "pwned"
    hostile = [
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"; touch {marker}",
        f"&& touch {marker}",
        "'quoted'",
        '"double"',
        "*",
        "~",
        "$HOME",
    ]
    with SshPool(sshd.settings()) as pool:
        r = pool.runner(sshd_hosts[0].host).run(["printf", "%s\\n", *hostile])
    assert r.ok and r.stdout.splitlines() == hostile
    assert not marker.exists()


def test_line_breaks_in_values_are_refused_before_sending(sshd, sshd_hosts, tmp_path):
    marker = tmp_path / "pwned"
    with SshPool(sshd.settings()) as pool:
        runner = pool.runner(sshd_hosts[0].host)
        with pytest.raises(CommandError):
            runner.run(["echo", f"x\ntouch {marker}"])
        with pytest.raises(CommandError):
            runner.run("touch " + str(marker))  # a string is not an argv
    assert not marker.exists()


@pytest.mark.parametrize(
    "host",
    [
        "$(touch {m})",
        "`touch {m}`",
        "127.0.0.2;touch {m}",
        "127.0.0.2\ntouch {m}",
        "-oProxyCommand=touch {m}",
        "-oProxyCommand=sh -c 'touch {m}'",
    ],
)
def test_hostile_host_names_rejected_before_any_connection(sshd, tmp_path, host):
    marker = tmp_path / "pwned"
    name = host.format(m=marker)
    with SshPool(sshd.settings()) as pool:
        with pytest.raises(InvalidHostError):
            pool.connection(name)
        with pytest.raises(InvalidHostError):
            pool.run_all(["127.0.0.2", name], ["touch", str(marker)])
        [res] = probe_hosts([name], pool)
        assert not res.ok and ("plain host name" in res.error or "option" in res.error)
        assert pool._conns == {}  # the valid host was not contacted either: names are checked first
    assert not marker.exists()


def test_unknown_host_key_is_refused_and_nothing_runs(sshd, sshd_hosts, tmp_path):
    marker = tmp_path / "ran"
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    settings = sshd.settings(known_hosts_path=str(empty))
    with pytest.raises(HostKeyUnknownError) as info:
        conn = connect(sshd_hosts[0].host, settings)
        conn.run(["touch", str(marker)])
    err = info.value
    assert err.fingerprint.startswith("SHA256:") and "taehv-console trust" in err.fix
    assert err.known_name == f"[{sshd_hosts[0].host}]:{sshd_hosts[0].port}"
    assert not marker.exists()
    assert empty.read_text() == ""  # refusal never writes the key anywhere


def test_changed_host_key_is_refused(sshd, sshd_hosts, tmp_path):
    import paramiko

    h = sshd_hosts[0]
    forged = tmp_path / "known_hosts"
    add_known_host(forged, f"[{h.host}]:{h.port}", paramiko.Ed25519Key.from_private_key_file(h.key_path))
    with pytest.raises(HostKeyChangedError) as info:
        connect(h.host, sshd.settings(known_hosts_path=str(forged)))
    assert "HOST KEY CHANGED" in str(info.value) and "--replace" in info.value.fix


def test_fetched_fingerprint_matches_ssh_keygen(sshd, sshd_hosts):
    import subprocess

    _, key = fetch_host_key(sshd_hosts[0].host, sshd.settings())
    out = subprocess.run(
        ["ssh-keygen", "-lf", sshd.host_key_path + ".pub"], capture_output=True, text=True, check=True
    ).stdout
    assert sha256_fingerprint(key) == out.split()[1]


def test_unreachable_hosts_are_findings_within_the_timeout_and_others_still_answer(sshd, sshd_hosts):
    # 127.0.0.9: nothing listens (refused at once). 127.0.0.10: a port that accepts TCP and then
    # never says a word, like a wedged sshd or a blackholing middlebox.
    silent = socket.socket()
    silent.bind(("127.0.0.10", sshd.port))
    silent.listen(8)
    try:
        settings = sshd.settings(connect_timeout_s=2.0)
        hosts = [sshd_hosts[0].host, "127.0.0.9", "127.0.0.10", sshd_hosts[1].host]
        with SshPool(settings) as pool:
            t0 = time.monotonic()
            results = {r.host: r for r in probe_hosts(hosts, pool)}
            elapsed = time.monotonic() - t0
    finally:
        silent.close()
    assert results[sshd_hosts[0].host].ok and results[sshd_hosts[1].host].ok
    refused, hung = results["127.0.0.9"], results["127.0.0.10"]
    assert not refused.ok and "refused" in refused.error.lower() and refused.fix
    assert not hung.ok and ("within 2 s" in hung.error or "timeout" in hung.error.lower())
    assert elapsed < 2.0 + 6  # one connect timeout, not one per host in turn


def test_command_timeout_stops_waiting(sshd, sshd_hosts):
    with SshPool(sshd.settings()) as pool:
        runner = pool.runner(sshd_hosts[0].host)
        t0 = time.monotonic()
        with pytest.raises(CommandTimeoutError):
            runner.run(["sleep", "30"], timeout=1)
        assert time.monotonic() - t0 < 5
        assert runner.run(["true"]).ok  # the connection is still usable


def test_detached_process_outlives_the_connection_and_stops_by_group(sshd, sshd_hosts, tmp_path):
    log = tmp_path / "logs" / "node-0.log"
    settings = sshd.settings()
    with SshPool(settings) as pool:
        runner = pool.runner(sshd_hosts[0].host)
        proc = runner.start_detached(
            ["sh", "-c", "echo started $0; sleep 60 & wait", "x"], log_path=str(log), env={"TAEHV_TEST": "1"}
        )
    assert proc.pgid == proc.pid  # a session leader: its pgid is what stop signals
    # A new connection sees it still running: closing the first one did not stop it.
    with SshPool(settings) as pool:
        runner = pool.runner(sshd_hosts[0].host)
        deadline = time.monotonic() + 10
        while "started" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "started x" in log.read_text()
        members = runner.group_pids(proc)
        assert proc.pid in members and len(members) >= 2  # the shell and its sleep child
        assert members == tuple(group_pids(proc.pgid))  # as this machine's /proc sees the group
        assert runner.signal_group(proc, "TERM")
        deadline = time.monotonic() + 10
        while group_pids(proc.pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group_pids(proc.pgid) == [] and runner.group_pids(proc) == ()  # every member gone
        assert not runner.signal_group(proc, "KILL")  # nothing left to signal


def test_pool_shares_one_connection_per_host_across_threads(sshd, sshd_hosts):
    with SshPool(sshd.settings()) as pool:
        seen = []
        threads = [
            threading.Thread(target=lambda: seen.append(pool.connection(sshd_hosts[2].host)))
            for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(c) for c in seen}) == 1


def test_known_hosts_replace_keeps_other_lines(tmp_path):
    import paramiko

    kh = tmp_path / "known_hosts"
    a = paramiko.RSAKey.generate(1024)
    b = paramiko.RSAKey.generate(1024)
    kh.write_text("# cluster keys\n" + f"other {a.get_name()} {a.get_base64()}\n")
    add_known_host(kh, "[10.0.0.5]:2222", a)
    add_known_host(kh, "[10.0.0.5]:2222", b, replace=True)
    lines = Path(kh).read_text().splitlines()
    assert lines[0] == "# cluster keys" and lines[1].startswith("other ")
    assert [ln for ln in lines if ln.startswith("[10.0.0.5]")] == [
        f"[10.0.0.5]:2222 ssh-rsa {b.get_base64()}"
    ]
    assert oct(kh.stat().st_mode & 0o777) == "0o600"


def test_local_runner_has_the_same_contract_without_ssh(tmp_path):
    from taehv_console.core.cluster.ssh import LocalRunner

    runner = LocalRunner()
    marker = tmp_path / "pwned"
    r = runner.run(["printf", "%s", f"$(touch {marker})"])
    assert r.ok and r.stdout == f"$(touch {marker})" and not marker.exists()  # no shell at all
    with pytest.raises(CommandError):
        runner.run(["echo", "a\nb"])  # refused like over SSH, so behaviour never differs
    with pytest.raises(CommandTimeoutError):
        runner.run(["sleep", "30"], timeout=0.5)
    proc = runner.start_detached(["sleep", "30"], log_path=str(tmp_path / "log"))
    assert proc.pgid == proc.pid and runner.group_pids(proc) == (proc.pid,)
    assert runner.signal_group(proc, "KILL")
    deadline = time.monotonic() + 10
    while group_pids(proc.pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group_pids(proc.pgid) == [] and runner.group_pids(proc) == ()
