"""NCCL RAS: the version policy, the verdict parsed from reports hand-built after NCCL's documented
sample output (fixtures/ras/README.md), the client protocol against a local server that answers as
NCCL's RAS thread does (src/ras/client.cc's handshake; NCCL cannot run here), and the gating in
StallForensics: never before the first step, never on a gloo run, at most every 15 s per node."""

from __future__ import annotations

import itertools
import os
import socket
import threading

import pytest

from taehv_console.core.cluster.ssh import SshPool, SshSettings
from taehv_console.core.forensics import RankRef, StallForensics, ras
from taehv_console.core.forensics import node as forensics_node
from tests.core.forensics.conftest import FIXTURES, make_run, write_heartbeat

RAS = FIXTURES / "ras"


# ------------------------------------------------------------------------------- version policy


@pytest.mark.parametrize(
    "version, allowed, why",
    [
        ((2, 21, 5), False, "no RAS service"),
        ((2, 24, 3), False, "#1669"),
        ((2, 26, 5), False, "#1718"),
        ((2, 27, 3), False, "#1762"),
        ((2, 29, 1), False, "corrupts memory"),
        ((2, 29, 2), True, "no known crash"),
        ((2, 30, 4), True, "no known crash"),
    ],
)
def test_version_policy(version, allowed, why):
    ok, reason = ras.may_query(version)
    assert ok is allowed and why in reason


def test_unknown_version_is_refused():
    assert ras.may_query(None) == (False, "the NCCL version of the ranks is unknown")


def test_policy_rows_cover_every_version_once():
    rules = ras.RAS_VERSION_POLICY
    assert rules[0].first == (0, 0, 0)
    assert all(a.last == b.first for a, b in itertools.pairwise(rules))
    assert all(r.reason for r in rules)


def test_version_codes_and_wheel_names():
    assert ras.version_from_code(22905) == (2, 29, 5)
    assert ras.version_from_code(2804) == (2, 8, 4)  # the pre-2.9 encoding
    assert ras.parse_version("nvidia_nccl_cu12-2.27.5.dist-info") == (2, 27, 5)


def test_version_from_the_wheel_beside_the_library(tmp_path):
    lib = tmp_path / "site-packages" / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    (tmp_path / "site-packages" / "nvidia_nccl_cu12-2.29.3.dist-info").mkdir()
    assert ras.nccl_version_of(str(lib)) == (2, 29, 3)


def test_loaded_nccl_reads_the_process_maps(tmp_path):
    pid_dir = tmp_path / "4242"
    pid_dir.mkdir()
    (pid_dir / "maps").write_text(
        "7f0000000000-7f0000001000 r-xp 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f1000000000-7f1000100000 r-xp 00000000 08:01 5678 "
        "/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2\n"
    )
    assert ras.loaded_nccl(4242, proc_root=str(tmp_path)).endswith("nvidia/nccl/lib/libnccl.so.2")
    assert ras.loaded_nccl(os.getpid()) == ""  # this test process has no NCCL


# ------------------------------------------------------------------------------------ verdicts


def test_healthy_report():
    v = ras.parse_status((RAS / "healthy.txt").read_text())
    assert v.healthy and v.statuses == ("group 0: RUNNING/OK",)
    assert v.line() == "RAS: every communicator RUNNING/OK"


def test_stopped_process_report_names_the_missing_rank():
    v = ras.parse_status((RAS / "stopped_incomplete.txt").read_text())
    assert v.incomplete == (
        "no answer from process 48213 on node 10.0.0.12 (GPU 1)",
        "communicator #0-0: missing ranks 5",
    )
    assert v.dead == () and v.mismatch == ()
    assert v.statuses == ("group 0: RUNNING/INCOMPLETE",)
    assert v.line().startswith("INCOMPLETE no answer from process 48213")


def test_dead_report():
    v = ras.parse_status((RAS / "dead.txt").read_text())
    assert v.dead == ("process 48213 on node 10.0.0.12 (GPU 1)",)
    assert v.incomplete == ("communicator #0-0: missing ranks 5",)
    assert v.line() == (
        "DEAD process 48213 on node 10.0.0.12 (GPU 1) | INCOMPLETE communicator #0-0: missing ranks 5"
    )


def test_mismatch_report_names_the_rank_behind():
    v = ras.parse_status((RAS / "mismatch.txt").read_text())
    assert v.mismatch == ("communicator #0-0: ranks 5 at op 6649 vs 6650",)


def test_not_a_report():
    with pytest.raises(ValueError, match="not a RAS status report"):
        ras.parse_status("SERVER PROTOCOL 2\n")


# ------------------------------------------------------------------------------------ protocol


class RasServer:
    """Answers as NCCL's RAS client socket does: CLIENT PROTOCOL -> SERVER PROTOCOL, TIMEOUT -> OK,
    STATUS / VERBOSE STATUS -> the report, then close. Records what it was asked."""

    def __init__(self, report: str):
        self.report = report
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.asked: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rwb", buffering=0) as f:
                for raw in f:
                    line = raw.decode().strip()
                    self.asked.append(line)
                    if line.startswith("CLIENT PROTOCOL"):
                        f.write(b"SERVER PROTOCOL 2\n")
                    elif line.startswith("TIMEOUT"):
                        f.write(b"OK\n")
                    elif line.endswith("STATUS"):
                        f.write(self.report.encode())
                        break

    def close(self) -> None:
        # shutdown wakes the thread blocked in accept(); a bare close would leave it waiting on a
        # file descriptor number the next server reuses, answering that server's clients
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def ras_server():
    servers = []

    def start(report: str) -> RasServer:
        servers.append(RasServer(report))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_query_speaks_the_protocol(ras_server):
    server = ras_server((RAS / "stopped_incomplete.txt").read_text())
    reply = ras.query(host="127.0.0.1", port=server.port, timeout=10)
    assert reply["kind"] == "ok"
    assert server.asked == ["CLIENT PROTOCOL 2", "TIMEOUT 5", "VERBOSE STATUS"]
    assert ras.parse_status(reply["text"]).incomplete[-1] == "communicator #0-0: missing ranks 5"


def test_nothing_listening_is_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        reply = ras.query(host="127.0.0.1", port=port, timeout=3)
    assert reply["kind"] == "unavailable" and f"127.0.0.1:{port}" in reply["error"]


def test_a_silent_server_times_out(ras_server):
    quiet = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    try:
        reply = ras.query(host="127.0.0.1", port=quiet.getsockname()[1], timeout=1.5)
    finally:
        quiet.close()
    assert reply["kind"] == "failed"


def test_node_side_refuses_a_process_without_nccl():
    reply = ras.query_for(os.getpid())
    assert reply["kind"] == "unavailable" and "no NCCL loaded" in reply["error"]


def test_node_side_refuses_an_unsafe_version(monkeypatch):
    monkeypatch.setattr(ras, "loaded_nccl", lambda pid: "/x/nvidia/nccl/lib/libnccl.so.2")
    monkeypatch.setattr(ras, "nccl_version_of", lambda lib: (2, 27, 5))
    reply = ras.query_for(1234)
    assert reply["kind"] == "refused" and "NCCL 2.27.5" in reply["error"] and "#1762" in reply["error"]


# ------------------------------------------------------------------------------------- gating


def _allow_version(monkeypatch, port: int):
    """The node helper, run in-process, sees a safe NCCL and asks our server's port."""
    monkeypatch.setattr(ras, "loaded_nccl", lambda pid: "/x/nvidia/nccl/lib/libnccl.so.2")
    monkeypatch.setattr(ras, "nccl_version_of", lambda lib: (2, 29, 3))
    real = forensics_node.run_action

    def run_action(args):
        if args.action == "ras":
            args.port = port
        return real(args)

    monkeypatch.setattr(forensics_node, "run_action", run_action)


def test_ras_in_collect_at_most_every_15_s(tmp_path, ras_server, monkeypatch):
    server = ras_server((RAS / "stopped_incomplete.txt").read_text())
    _allow_version(monkeypatch, server.port)
    run = make_run(
        tmp_path, device="cuda", nodes=1, gpus_per_node=2, nccl_env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    )
    write_heartbeat(run, 0, step=3, pid=os.getpid())
    now = [1000.0]
    with SshPool(SshSettings.from_env()) as pool:
        f = StallForensics(run, pool, clock=lambda: now[0])
        peer = RankRef(0, 0, "localhost", os.getpid())
        first = f.collect(RankRef(1, 0, "localhost", 999999), peer)
        now[0] += 10
        second = f.collect(RankRef(1, 0, "localhost", 999999), peer)
        now[0] += 6
        third = f.collect(RankRef(1, 0, "localhost", 999999), peer)
    assert (
        first.ras == "INCOMPLETE no answer from process 48213 on node 10.0.0.12 (GPU 1); "
        "communicator #0-0: missing ranks 5"
    )
    assert second.ras == first.ras  # 10 s later: the last verdict, not a new query
    assert third.ras == first.ras
    assert server.asked.count("VERBOSE STATUS") == 2  # at 0 s and 16 s


def test_ras_not_asked_before_the_first_step(tmp_path, ras_server, monkeypatch):
    server = ras_server((RAS / "healthy.txt").read_text())
    _allow_version(monkeypatch, server.port)
    run = make_run(
        tmp_path, device="cuda", nodes=1, gpus_per_node=2, nccl_env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    )
    write_heartbeat(run, 0, step=0, pid=os.getpid())
    with SshPool(SshSettings.from_env()) as pool:
        report = StallForensics(run, pool).collect(
            RankRef(1, 0, "localhost", 999999), RankRef(0, 0, "localhost", os.getpid())
        )
    assert report.ras is None and server.asked == []
    assert any("communicator init" in n for n in report.notes)


def test_ras_on_a_gloo_run_is_unavailable_and_never_asked(tmp_path, ras_server, monkeypatch):
    server = ras_server((RAS / "healthy.txt").read_text())
    _allow_version(monkeypatch, server.port)
    run = make_run(tmp_path, device="cpu")
    write_heartbeat(run, 0, step=3, pid=os.getpid())
    with SshPool(SshSettings.from_env()) as pool:
        report = StallForensics(run, pool).collect(
            RankRef(1, 0, "localhost", 999999), RankRef(0, 0, "localhost", os.getpid())
        )
    assert report.ras is None and server.asked == []
    assert [n for n in report.notes if "RAS" in n] == [
        "NCCL RAS unavailable: this run uses gloo (CPU), not NCCL"
    ]
