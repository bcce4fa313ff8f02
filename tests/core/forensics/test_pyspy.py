"""py-spy stacks: parsing and error recognition on recorded py-spy 0.4.3 output (record_fixtures.py),
then the real tool on real stuck processes: running, SIGSTOPped, gone, missing, not permitted
(a real CAP_SYS_PTRACE drop), locally and through the loopback sshd."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from taehv_console.core.cluster.ssh import SshPool, SshSettings
from taehv_console.core.forensics import RankRef, StallForensics, pyspy
from taehv_console.core.forensics.node import main as node_main
from tests.core.forensics.conftest import FIXTURES, make_run, sigstop

HAVE_PYSPY = pyspy.find_pyspy(sys.executable) is not None
needs_pyspy = pytest.mark.skipif(not HAVE_PYSPY, reason="py-spy not installed beside this python")


# ------------------------------------------------------------------------------ recorded output


def test_parse_dump_reads_threads_and_innermost_first_frames():
    dump = pyspy.parse_dump((FIXTURES / "pyspy_two_threads.txt").read_text())
    assert [t.name for t in dump.threads] == ["MainThread", "loader-0"]
    main = dump.main_thread()
    assert main is not None and main.tid == dump.pid
    assert main.frames == (
        "wait_for_batch (<string>:9)",
        "train_step (<string>:11)",
        "<module> (<string>:12)",
    )
    assert dump.threads[1].frames[0] == "loader_worker (<string>:5)"
    assert main.status == "idle"


def test_parse_dump_skips_a_multiline_command_in_the_header():
    # the recorded process was `python -c '<12 lines>'`: its indented code lines are no frames
    dump = pyspy.parse_dump((FIXTURES / "pyspy_stopped_nonblocking.txt").read_text())
    assert all("while True" not in f for t in dump.threads for f in t.frames)
    assert len(dump.threads) == 2


def test_parse_dump_refuses_an_error_report():
    with pytest.raises(ValueError, match="no thread"):
        pyspy.parse_dump((FIXTURES / "pyspy_stopped_blocking.txt").read_text())


@pytest.mark.parametrize(
    "fixture, kind",
    [
        ("pyspy_denied_no_sys_ptrace.txt", pyspy.DENIED),
        ("pyspy_gone.txt", pyspy.GONE),
        ("pyspy_stopped_blocking.txt", pyspy.FAILED),
    ],
)
def test_failures_are_told_apart(fixture, kind):
    assert pyspy.classify_failure((FIXTURES / fixture).read_text()) == kind


def test_pyspys_own_container_hint_counts_as_not_permitted():
    # both strings are in the py-spy 0.4.3 binary; seccomp-blocked process_vm_readv prints them
    text = (
        "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'\n"
        "It looks like you are running in a docker container. Please make sure you started your container "
        "with the SYS_PTRACE capability."
    )
    assert pyspy.classify_failure(text) == pyspy.DENIED


def test_error_summary_drops_the_rust_backtrace():
    summary = pyspy.error_summary((FIXTURES / "pyspy_denied_no_sys_ptrace.txt").read_text())
    assert "Permission denied (os error 13)" in summary
    assert "Stack backtrace" not in summary and "anyhow" not in summary


# ------------------------------------------------------------------------------- the real tool


@needs_pyspy
def test_dump_of_a_running_process(stuck_process):
    p = stuck_process()
    reply = pyspy.dump_process(p.pid, python=sys.executable)
    assert reply["kind"] == pyspy.OK, reply
    assert reply["nonblocking"] is False
    assert pyspy.parse_dump(reply["text"]).main_thread().frames[0].startswith("wait_for_batch")


@needs_pyspy
def test_dump_of_a_sigstopped_process_reads_it_without_suspending(stuck_process):
    p = stuck_process()
    sigstop(p.pid)
    reply = pyspy.dump_process(p.pid, python=sys.executable)
    assert reply["kind"] == pyspy.OK, reply
    assert reply["state"] == "T" and reply["nonblocking"] is True
    frames = pyspy.parse_dump(reply["text"]).main_thread().frames
    assert frames[0].startswith("wait_for_batch (<string>:") and frames[1].startswith("train_step (")
    # the dump left it stopped, and it still runs on once continued
    os.kill(p.pid, signal.SIGCONT)
    assert p.poll() is None


@needs_pyspy
def test_gone_process(stuck_process):
    p = stuck_process()
    p.kill()
    p.wait()
    assert pyspy.dump_process(p.pid, python=sys.executable)["kind"] == pyspy.GONE


def test_missing_pyspy_is_said(stuck_process, monkeypatch, tmp_path):
    p = stuck_process()
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there, and no py-spy beside /nonexistent/python
    reply = pyspy.dump_process(p.pid, python="/nonexistent/python")
    assert reply["kind"] == pyspy.MISSING
    assert "not installed" in reply["error"]


needs_root_caps = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("capsh") or not shutil.which("setpriv") or not HAVE_PYSPY,
    reason="needs root, capsh and setpriv to drop CAP_SYS_PTRACE for real",
)


@needs_root_caps
def test_node_helper_without_sys_ptrace_says_not_permitted(stuck_process, capfd):
    # the rank belongs to another user and the helper runs without CAP_SYS_PTRACE: what a
    # container without --cap-add SYS_PTRACE gives
    p = stuck_process("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    import json
    import subprocess

    res = subprocess.run(
        [
            "capsh",
            "--drop=cap_sys_ptrace",
            "--",
            "-c",
            f"exec {sys.executable} -m taehv_console.core.forensics.node pyspy --pid {p.pid}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[3],
    )
    reply = json.loads(res.stdout.strip().splitlines()[-1])
    assert reply["kind"] == pyspy.DENIED, reply
    assert "Permission denied" in reply["error"]


def test_node_helper_prints_one_json_object(stuck_process, capsys):
    p = stuck_process()
    assert node_main(["pyspy", "--pid", str(p.pid)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("{")


# ----------------------------------------------------------------------- StallForensics, local


@needs_pyspy
def test_collect_dumps_stalled_and_peer_into_the_run_dir(stuck_process, tmp_path):
    stalled, peer = stuck_process(), stuck_process()
    sigstop(stalled.pid)
    run = make_run(tmp_path)
    with SshPool(SshSettings.from_env()) as pool:
        report = StallForensics(run, pool).collect(
            RankRef(1, 0, "localhost", stalled.pid), RankRef(0, 0, "localhost", peer.pid)
        )
    assert report.stalled_rank == 1
    roles = {d.role: d for d in report.dumps}
    assert set(roles) == {"stalled", "peer"}
    s = roles["stalled"]
    assert s.rank == 1 and s.pid == stalled.pid and s.process_state == "T"
    assert s.frames[0].startswith("wait_for_batch (<string>:")
    assert s.threads == 2
    path = Path(s.path)
    assert path.parent == run / "forensics" and path.name.startswith("pyspy-rank1-stalled-")
    assert "--nonblocking" in path.read_text().splitlines()[0]
    assert "loader_worker" in path.read_text()  # the whole dump is kept, every thread
    assert Path(roles["peer"].path).name.startswith("pyspy-rank0-peer-")
    # a CPU run: Flight Recorder and RAS are said to be unavailable, once each
    assert sum("Flight Recorder unavailable" in n for n in report.notes) == 1
    assert sum("NCCL RAS unavailable" in n for n in report.notes) == 1
    assert report.to_json()["dumps"][0]["frames"]
    assert not list((run / "forensics").glob(".*.tmp"))


def test_collect_says_once_when_pyspy_is_missing_and_carries_on(stuck_process, tmp_path, monkeypatch):
    stalled, peer = stuck_process(), stuck_process()
    run = make_run(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(pyspy, "find_pyspy", lambda python=None: None)
    with SshPool(SshSettings.from_env()) as pool:
        f = StallForensics(run, pool)
        report = f.collect(RankRef(1, 0, "localhost", stalled.pid), RankRef(0, 0, "localhost", peer.pid))
        again = f.collect(RankRef(1, 0, "localhost", stalled.pid), RankRef(0, 0, "localhost", peer.pid))
    assert report.dumps == ()
    missing = [n for n in report.notes if "py-spy not installed" in n]
    assert len(missing) == 1 and "node 0" in missing[0]  # both ranks on one node: said once
    assert [n for n in again.notes if "py-spy" in n] == missing


# ------------------------------------------------------------------------ through the loopback sshd


@needs_pyspy
def test_collect_over_ssh_for_a_remote_node(sshd, stuck_process, tmp_path):
    stalled = stuck_process()
    sigstop(stalled.pid)
    host = sshd.hosts[0].host
    run = make_run(tmp_path, nodes=2, gpus_per_node=1, hosts=("localhost", host))
    with SshPool(sshd.settings()) as pool:
        report = StallForensics(run, pool).collect(RankRef(1, 1, "some-hostname", stalled.pid), None)
        assert host in pool._conns  # it went through SSH, not in-process
    (dump,) = report.dumps
    assert dump.host == host and dump.process_state == "T"
    assert dump.frames[0].startswith("wait_for_batch (<string>:")


@needs_root_caps
def test_remote_node_without_sys_ptrace_is_noted_once(sshd, stuck_process, tmp_path):
    # the "node's python" runs the helper with CAP_SYS_PTRACE dropped, like a container without it
    other = stuck_process("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    other2 = stuck_process("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    wrapper = tmp_path / "python-no-ptrace"
    wrapper.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        cd {Path(__file__).parents[3]}
        exec capsh --drop=cap_sys_ptrace -- -c 'exec "$0" "$@"' {sys.executable} "$@"
        """)
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    shutil.copy(Path(sys.executable).parent / "py-spy", tmp_path / "py-spy")  # found beside the python
    host = sshd.hosts[1].host
    run = make_run(tmp_path, nodes=1, gpus_per_node=2, hosts=(host,))
    with SshPool(sshd.settings(python=str(wrapper))) as pool:
        report = StallForensics(run, pool).collect(
            RankRef(1, 0, host, other.pid), RankRef(0, 0, host, other2.pid)
        )
    assert report.dumps == ()
    denied = [n for n in report.notes if "not permitted" in n]
    assert len(denied) == 1, report.notes
    assert "node 0" in denied[0] and "SYS_PTRACE" in denied[0]


@needs_pyspy
def test_a_report_reads_back_from_its_json(stuck_process, tmp_path):
    import json

    from taehv_console.core.forensics import ForensicsReport

    stalled = stuck_process()
    with SshPool(SshSettings.from_env()) as pool:
        report = StallForensics(make_run(tmp_path), pool).collect(
            RankRef(1, 0, "localhost", stalled.pid), None
        )
    # what `status` in another process reads back from the run directory is the same value
    assert ForensicsReport.from_json(json.loads(json.dumps(report.to_json()))) == report
