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
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
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


# ---------------------------------------------------------------- the reaper: tests end what they start
#
# Every process a test starts goes through subprocess.Popen (subprocess.run and asyncio's
# subprocesses too), which this file replaces for the session with a subclass that records each
# process with its owner: the fixture whose setup is running (module and session fixtures keep
# their processes across tests), else the test being run, else the session. When the owner ends
# (the fixture is finalized, the test's teardown is over, the session finishes), whatever of it is
# still alive is ended: its process group when it has one of its own (start_new_session=True), else
# the process, and in both cases everything below them, with SIGTERM, then SIGKILL after
# REAP_GRACE_S. Teardown runs whether the test passed, failed or hit pytest-timeout's signal
# method (the Timeout is raised in the test; SIGALRM is held off while the reaper works), and on
# Ctrl-C or SIGTERM (turned into KeyboardInterrupt) pytest tears down and finishes the session.
# When pytest dies without that (SIGKILL, pytest-timeout's thread method, which calls os._exit), a
# guardian process in a session of its own, told of every process as it starts, ends them.
#
# Runs launched by a console under test detach their launchers on purpose; tests stop them through
# the product. As a last resort, a failed test's runs are ended by the pgids their state.json
# records. At the end of the session a check looks for any process still carrying this session's
# mark (TAEHV_TEST_SESSION in its environment, inherited by everything started from here) or
# naming this session's temporary directory on its command line: those leaked; they are listed,
# ended, and the session exits non-zero.

SESSION_MARK = "TAEHV_TEST_SESSION"
REAP_GRACE_S = 5.0
LEAK_GRACE_S = 10.0
_OriginalPopen = subprocess.Popen


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, start time in clock ticks) of a process, None when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[2]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _proc_table() -> dict[int, tuple[str, int, int, int]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


def process_tree(pid: int) -> list[int]:
    """pid and every process below it, parents before their children (from /proc's ppids)."""
    children: dict[int, list[int]] = {}
    for child, (_, ppid, _, _) in _proc_table().items():
        children.setdefault(ppid, []).append(child)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _alive(pid: int, start: int | None) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X") and (start is None or st[3] == start)


@dataclass
class Started:
    pid: int
    start: int | None  # with the pid, names one process even after the pid is reused
    own_group: bool
    argv: str
    owner: str
    popen: object = None  # weakref to the Popen, to collect its exit status

    def poll(self) -> None:
        popen = self.popen() if self.popen is not None else None
        if popen is not None:
            popen.poll()

    def exited(self) -> bool:
        popen = self.popen() if self.popen is not None else None
        return popen is not None and popen.returncode is not None


def end_processes(records: list[Started], grace: float = REAP_GRACE_S) -> list[str]:
    """SIGTERM, then SIGKILL after `grace`, to the recorded groups and processes still alive and
    everything below them. Returns a line for each one that was still alive."""
    if not records:
        return []
    for r in records:
        r.poll()
    if all(r.exited() and not r.own_group for r in records):
        return []
    table = _proc_table()
    live = {pid: st for pid, st in table.items() if st[0] not in ("Z", "X")}
    said, groups, pids = [], set(), set()
    ours = os.getpgrp()
    for r in records:
        st = table.get(r.pid)
        if st is not None and r.start is not None and st[3] != r.start:
            continue  # the pid (and so the group id) is someone else's now
        if r.own_group and r.pid != ours:
            members = [pid for pid, s in live.items() if s[2] == r.pid]
            if members:
                groups.add(r.pid)
                pids.update(members)
                said.append(f"process group {r.pid} ({len(members)} alive) of `{r.argv}`, from {r.owner}")
        elif r.pid in live:
            pids.add(r.pid)
            said.append(f"pid {r.pid} `{r.argv}`, from {r.owner}")
    children: dict[int, list[int]] = {}
    for pid, st in live.items():
        children.setdefault(st[1], []).append(pid)
    todo = list(pids)
    while todo:  # below them, also what left their group for a session of its own
        for child in children.get(todo.pop(), []):
            if child not in pids:
                pids.add(child)
                todo.append(child)
    pids.discard(os.getpid())
    if not pids:
        return []
    starts = {pid: live[pid][3] for pid in pids}
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for g in groups:
            try:
                os.killpg(g, sig)
            except OSError:
                pass
        for pid in pids:
            if _alive(pid, starts[pid]):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        deadline = time.monotonic() + wait_s
        while True:
            for r in records:
                r.poll()
            left = [pid for pid in pids if _alive(pid, starts[pid])]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not left:
            break
    return said


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _marked(pid: int, marker: str, basetemp: str | None) -> bool:
    """Whether a process is this session's: it carries the session's mark in its environment, or
    names the session's temporary directory on its command line."""
    if basetemp and (basetemp.rstrip("/") + "/") in _cmdline(pid) + "/":
        return True
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{SESSION_MARK}={marker}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def find_leaks(marker: str, basetemp: str | None, exclude: set[int]) -> dict[int, str]:
    """Processes alive that are this session's (see _marked), but for `exclude`."""
    out = {}
    for pid, st in _proc_table().items():
        if pid in exclude or st[0] in ("Z", "X"):
            continue
        if _marked(pid, marker, basetemp):
            out[pid] = _cmdline(pid)[:300]
    return out


def run_groups(root: Path) -> list[tuple[int, str]]:
    """(pgid, run dir) of the nodes of each run's newest attempt under root, from state.json."""
    out = []
    for path in root.rglob("state.json"):
        try:
            nodes = json.loads(path.read_text())["attempts"][-1]["nodes"]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue
        for node in nodes:
            pgid = node.get("pgid") if isinstance(node, dict) else None
            if isinstance(pgid, int) and pgid > 1:
                out.append((pgid, str(path.parent)))
    return out


def end_run_groups(root: Path, marker: str, basetemp: str | None, why: str, wait_s: float = 0.0) -> list[str]:
    """End the recorded process groups of the runs under root whose members are this session's,
    after giving them `wait_s` to end on their own (a stop still saving its checkpoint)."""
    groups = run_groups(root)
    if not groups:
        return []
    deadline = time.monotonic() + wait_s
    while True:
        records = []
        table = _proc_table()
        for pgid, run_dir in groups:
            members = [pid for pid, st in table.items() if st[2] == pgid and st[0] not in ("Z", "X")]
            if pgid != os.getpgrp() and any(_marked(pid, marker, basetemp) for pid in members):
                st = table.get(pgid)
                records.append(Started(pgid, st[3] if st else None, True, f"run {run_dir}", why))
        if not records or time.monotonic() >= deadline:
            return end_processes(records)
        time.sleep(0.2)


def end_pids(pids: list[int]) -> None:
    table = _proc_table()
    end_processes([Started(pid, table[pid][3], False, "", "") for pid in pids if pid in table])


class Reaper:
    """The registry of the processes tests start (see the comment above)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.records: dict[object, list[Started]] = {}
        self.owners: list[tuple[object, str]] = []
        self.item: object = None
        self.marker = ""
        self.basetemp: str | None = None
        self.guardian: subprocess.Popen | None = None
        self.ended: list[str] = []  # what teardowns had to end, for the summary
        self.leaks: list[str] = []

    def owner(self) -> tuple[object, str]:
        if self.owners:
            return self.owners[-1]
        if self.item is not None:
            return self.item, getattr(self.item, "nodeid", "a test")
        return "session", "the session"

    def record(self, popen: subprocess.Popen) -> None:
        import weakref

        try:
            pgid = os.getpgid(popen.pid)
        except OSError:
            return
        st = _stat(popen.pid)
        args = popen.args
        argv = args if isinstance(args, (str, bytes)) else " ".join(map(str, args))
        key, label = self.owner()
        rec = Started(
            popen.pid, st[3] if st else None, pgid == popen.pid, str(argv)[:160], label, weakref.ref(popen)
        )
        with self.lock:
            recs = self.records.setdefault(key, [])
            # what ended without a group of its own leaves nothing the reaper could still find
            recs[:] = [r for r in recs if r.own_group or not r.exited()]
            recs.append(rec)
            self._tell(f"{rec.pid} {rec.start or 0} {int(rec.own_group)}\n")

    def _tell(self, line: str) -> None:
        g = self.guardian
        if g is not None and g.stdin is not None:
            try:
                g.stdin.write(line.encode())
                g.stdin.flush()
            except (OSError, ValueError):
                pass

    def reap(self, key: object) -> list[str]:
        with self.lock:
            records = self.records.pop(key, [])
        said = end_processes(records)
        self.ended.extend(said)
        return said

    def reap_where(self, pred) -> list[str]:
        with self.lock:
            keys = [k for k in self.records if pred(k)]
        return [line for k in keys for line in self.reap(k)]

    def start_guardian(self) -> None:
        self.guardian = _OriginalPopen(
            [sys.executable, __file__, "--guard", str(os.getpid()), self.marker, self.basetemp or ""],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # outlives a kill of pytest's process group
        )

    def stop_guardian(self) -> None:
        g, self.guardian = self.guardian, None
        if g is not None:
            try:
                g.stdin.write(b"bye\n")
                g.stdin.close()
            except (OSError, ValueError):
                pass
            try:
                g.wait(10)
            except subprocess.TimeoutExpired:
                g.kill()
                g.wait()


REAPER = Reaper()


class ReapedPopen(_OriginalPopen):
    """subprocess.Popen, recorded with its owner for the reaper."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        REAPER.record(self)


class _NoAlarm:
    """Holds off SIGALRM (pytest-timeout's signal method) while the reaper works, so a timeout
    that falls in teardown fails the test after the processes are ended, not halfway through."""

    def __enter__(self):
        self.held = threading.current_thread() is threading.main_thread()
        if self.held:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})

    def __exit__(self, *exc):
        if self.held:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})


_FAILED = pytest.StashKey[bool]()
_TMP = pytest.StashKey[Path]()
_previous_sigterm: object = None


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    REAPER.marker = uuid.uuid4().hex
    os.environ[SESSION_MARK] = REAPER.marker  # everything started from here carries it
    subprocess.Popen = ReapedPopen  # type: ignore[misc]
    config.pluginmanager.register(_FixtureOwners(), "taehv-reaper-fixtures")
    from tests import timing  # here: this file also runs as a script (the guardian, _guard)

    config.pluginmanager.register(timing, "taehv-timing")


# The console tier runs beside the trainer and e2e tiers (scripts/test.sh). In path order it began
# with its own waits (tests/core/cluster and tests/core/run wait on sshd and fake launchers) while the
# other tiers started up or waited too: a /proc sampler over a whole run (2-core AMD EPYC) showed both
# cores about half idle for ~7 minutes early in the suite. So the console tier runs first the
# directories with more work than waiting in them (the planner's tests, the benchmarks' smoke runs at
# the top level, the TUI's Pilot tests and their short runs), and its waiting ones after them. Each
# module keeps its place within its group, so its fixtures and its tests' order are as before.
# tests/core/watch's test_kmsg plants Xid lines in this machine's real kernel log, which every watch
# agent running then reads; no CPU run's node is blamed for one (core/watch/hardware.py), so it may
# run beside the other tiers' runs.
CONSOLE_TIER_FIRST = ("tests/ui/", "tests/core/plan/")
_REPO = Path(__file__).resolve().parents[1]


def _console_tier_group(item: pytest.Item) -> int:
    try:
        rel = Path(item.path).resolve().relative_to(_REPO).as_posix()
    except ValueError:  # a pytest session that a test starts on files of its own (tests/test_reaper.py)
        return 1
    return 0 if rel.startswith(CONSOLE_TIER_FIRST) or Path(rel).parent == Path("tests") else 1


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TAEHV_TEST_TIER") == "console":
        items.sort(key=_console_tier_group)  # stable


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    global _previous_sigterm
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is not None:
        REAPER.basetemp = str(factory.getbasetemp())
    REAPER.start_guardian()
    if threading.current_thread() is threading.main_thread():
        _previous_sigterm = signal.getsignal(signal.SIGTERM)
        if _previous_sigterm == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _sigterm)  # a SIGTERM tears down like Ctrl-C


class _FixtureOwners:
    """Fixture hooks, registered as a plugin of their own: a conftest's hooks are only called for
    nodes below it, and a session-scoped fixture (sshd) is set up and finalized on the session."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        with REAPER.lock:
            REAPER.owners.append((fixturedef, f"fixture {fixturedef.argname} ({fixturedef.scope})"))
        before = _entries(REAPER.basetemp) if fixturedef.scope in ("session", "package") else None
        try:
            return (yield)
        finally:
            with REAPER.lock:
                REAPER.owners.pop()
            if before is not None:  # what a session (or package) fixture made outlives the module
                _SESSION_DIRS.update(_entries(REAPER.basetemp) - before)

    def pytest_fixture_post_finalizer(self, fixturedef, request):
        with _NoAlarm():
            REAPER.reap(fixturedef)


# Disk. A test's run directory holds ~0.5-0.9 GB (three ZeRO checkpoints of an 11M-parameter model);
# kept, the suite's ~40 runs wrote 29 GB per session and a CI machine with less free disk than that
# failed every later test on mkdir. What a passed test, or a module whose tests all passed, wrote
# under the base temp is removed as soon as it ends; a failure's directories stay for reading while
# the base temp keeps KEEP_FAILED_MIN_FREE free (scripts/test.sh puts it in memory, on /dev/shm,
# where a change that fails every test would otherwise fill the machine's memory with checkpoints).
_SESSION_DIRS: set[Path] = set()
KEEP_FAILED_MIN_FREE = 4 << 30
_NOT_KEPT: list[str] = []  # failures' directories removed for want of room


def _room_to_keep(path: Path) -> bool:
    try:
        return shutil.disk_usage(path).free >= KEEP_FAILED_MIN_FREE
    except OSError:
        return False


def _entries(base: str | None) -> set[Path]:
    if not base or not os.path.isdir(base):
        return set()
    return set(Path(base).iterdir())


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _module_temp_dirs(request):
    """Removes what this module's fixtures made under the base temp once all its tests passed."""
    before = _entries(REAPER.basetemp)
    failed = request.session.testsfailed
    yield
    if request.session.testsfailed == failed:
        for path in _entries(REAPER.basetemp) - before - _SESSION_DIRS:
            with _NoAlarm():
                end_run_groups(path, REAPER.marker, REAPER.basetemp, str(request.node.nodeid))
            _remove(path)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    REAPER.item = item
    try:
        return (yield)
    finally:
        REAPER.item = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    if rep.failed:
        item.stash[_FAILED] = True
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if isinstance(tmp, Path):
        item.stash[_TMP] = tmp
    return rep


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        with _NoAlarm():
            REAPER.reap(item)
            # function-scoped fixtures whose finalizer never ran (a setup that failed)
            REAPER.reap_where(lambda k: getattr(k, "scope", None) == "function")
            tmp = item.stash.get(_TMP, None)
            if tmp is not None and tmp.is_dir():
                passed = not item.stash.get(_FAILED, False)
                said = end_run_groups(
                    tmp, REAPER.marker, REAPER.basetemp, item.nodeid, LEAK_GRACE_S if passed else 0.0
                )
                if said and passed:
                    # a test that passed and left its run going: reported at the end of the session
                    REAPER.leaks.extend(f"{line} (left running after it passed)" for line in said)
                else:
                    REAPER.ended.extend(said)
                # a run directory holds ~0.7 GB of checkpoints: keep only failures', while there is room
                if passed or not _room_to_keep(tmp):
                    if not passed:
                        _NOT_KEPT.append(f"{item.nodeid}: {tmp}")
                    _remove(tmp)


@pytest.fixture
def reaper() -> Reaper:
    """The registry: processes started in a test are already in it (see the comment above)."""
    return REAPER


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of session fixtures
def pytest_sessionfinish(session, exitstatus):
    with _NoAlarm():
        REAPER.reap_where(lambda k: True)
        exclude = {os.getpid()}
        if REAPER.guardian is not None:
            exclude.add(REAPER.guardian.pid)
        deadline = time.monotonic() + LEAK_GRACE_S
        leaks = find_leaks(REAPER.marker, REAPER.basetemp, exclude)
        while leaks and time.monotonic() < deadline:  # let what is on its way out go
            time.sleep(0.2)
            leaks = find_leaks(REAPER.marker, REAPER.basetemp, exclude)
        REAPER.leaks.extend(f"pid {pid}: {cmd}" for pid, cmd in sorted(leaks.items()))
        if REAPER.basetemp:
            end_run_groups(Path(REAPER.basetemp), REAPER.marker, REAPER.basetemp, "the session")
        end_pids(sorted(leaks))
    if REAPER.leaks:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [
            "processes left running by this session (the reaper has ended them now):",
            *REAPER.leaks,
        ]
        if tr is not None:
            tr.ensure_newline()
            tr.write_sep("=", "LEAKED PROCESSES", red=True, bold=True)
            for line in lines:
                tr.write_line(line, red=True)
        else:
            print("\n".join(lines), file=sys.stderr)
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if REAPER.ended:
        terminalreporter.write_sep("-", "reaper: processes tests left behind, ended at teardown")
        for line in REAPER.ended:
            terminalreporter.write_line(line)
    if _NOT_KEPT:
        terminalreporter.write_sep(
            "-",
            f"failed tests' directories removed: under {KEEP_FAILED_MIN_FREE >> 30} GiB free to keep them",
        )
        for line in _NOT_KEPT:
            terminalreporter.write_line(line)


def pytest_unconfigure(config):
    subprocess.Popen = _OriginalPopen  # type: ignore[misc]
    REAPER.stop_guardian()
    if _previous_sigterm is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _previous_sigterm)


def _guard(parent: int, marker: str, basetemp: str) -> None:
    """The guardian: waits for pytest; if it ends without saying bye, ends what it started."""
    records: list[Started] = []
    said_bye = threading.Event()
    closed = threading.Event()

    def read() -> None:
        for line in sys.stdin:
            parts = line.split()
            if parts == ["bye"]:
                said_bye.set()
                break
            if len(parts) == 3:
                pid, start, own = map(int, parts)
                records.append(Started(pid, start or None, bool(own), "", "the test session"))
        closed.set()

    threading.Thread(target=read, daemon=True).start()
    while not closed.wait(0.5) and os.getppid() == parent:
        pass
    if said_bye.is_set():
        return
    said = end_processes(records)
    leaks = find_leaks(marker, basetemp or None, {os.getpid()})
    if basetemp:
        said += end_run_groups(Path(basetemp), marker, basetemp, "the test session")
    end_pids(sorted(leaks))
    if said or leaks:
        try:
            print(
                f"tests/conftest.py reaper: pytest ({parent}) ended without tearing down; ended:\n  "
                + "\n  ".join(said + [f"pid {p}: {c}" for p, c in sorted(leaks.items())]),
                file=sys.stderr,
            )
        except OSError:
            pass


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--guard":
    _guard(int(sys.argv[2]), sys.argv[3], sys.argv[4])
