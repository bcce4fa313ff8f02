"""`spawn signal` and `spawn pids` (the node tool that signals, or lists, a group `spawn start`
started) act only on a group whose leader is proven the one started: its start time and boot id as
`start` reported them. A bare pgid is refused by the tool itself, and a pgid that names an unrelated
process (or a group whose leader is gone) is sent nothing and listed as nothing, with why. Real
processes, the real tool (issue 44)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from taehv_console.core.cluster.spawn import boot_id, group_pids, read_proc_one
from taehv_console.core.cluster.ssh import LocalRunner

pytestmark = pytest.mark.timeout(120)


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "taehv_console.core.cluster.spawn", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def unrelated() -> Iterator[subprocess.Popen]:
    """Someone else's process, leader of its own group, never started through the tool."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _alive(pid: int) -> bool:
    entry = read_proc_one(pid)
    return entry is not None and entry[3] != "Z"


def test_a_bare_pgid_is_refused_by_the_tool(unrelated):
    out = _tool("signal", "--pgid", str(unrelated.pid), "--signal", "KILL")
    assert out.returncode == 2 and "--start-ticks" in out.stderr
    assert _alive(unrelated.pid)
    out = _tool("pids", "--pgid", str(unrelated.pid))
    assert out.returncode == 2 and "--start-ticks" in out.stderr and not out.stdout


def test_an_unrelated_process_under_a_recorded_pgid_is_listed_as_nothing(unrelated):
    ticks = read_proc_one(unrelated.pid)[4]
    out = _tool("pids", "--pgid", str(unrelated.pid), "--start-ticks", str(ticks + 1))
    reply = json.loads(out.stdout)
    assert out.returncode == 0 and reply["pids"] == [], reply
    assert f"pid {unrelated.pid} is another process" in reply["error"], reply
    out = _tool(
        "pids", "--pgid", str(unrelated.pid), "--start-ticks", str(ticks), "--boot-id", "not-this-boot"
    )
    reply = json.loads(out.stdout)
    assert reply["pids"] == [] and "another boot" in reply["error"], reply
    # its own start time on this boot proves it: then it is listed
    out = _tool("pids", "--pgid", str(unrelated.pid), "--start-ticks", str(ticks), "--boot-id", boot_id())
    assert json.loads(out.stdout) == {"pgid": unrelated.pid, "pids": [unrelated.pid], "error": ""}


def test_an_unrelated_process_under_a_recorded_pgid_is_sent_nothing(unrelated):
    ticks = read_proc_one(unrelated.pid)[4]
    for wrong in (ticks - 1, ticks + 1000):  # a start time that is not its own: a reused pid
        out = _tool("signal", "--pgid", str(unrelated.pid), "--start-ticks", str(wrong), "--signal", "KILL")
        reply = json.loads(out.stdout)
        assert out.returncode == 0 and reply["sent"] is False, reply
        assert f"pid {unrelated.pid} is another process" in reply["error"] and str(wrong) in reply["error"]
    # recorded on another boot: the node restarted since, whatever holds the pid now is not it
    out = _tool(
        "signal", "--pgid", str(unrelated.pid), "--start-ticks", str(ticks), "--boot-id", "not-this-boot"
    )
    reply = json.loads(out.stdout)
    assert reply["sent"] is False and "another boot" in reply["error"], reply
    time.sleep(0.2)
    assert _alive(unrelated.pid)


def test_a_group_whose_leader_is_gone_is_sent_nothing(tmp_path):
    runner = LocalRunner()
    proc = runner.start_detached(["sh", "-c", "sleep 300 & echo $!; exit 0"], log_path=str(tmp_path / "log"))
    deadline = time.monotonic() + 10
    while _alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = group_pids(proc.pgid)
    try:
        assert left and proc.pid not in left  # the sleep is left in the group, its leader is gone
        assert not runner.signal_group(proc, "KILL")
        out = _tool("signal", "--pgid", str(proc.pgid), "--start-ticks", str(proc.start_ticks))
        assert "leader is gone" in json.loads(out.stdout)["error"]
        assert runner.group_pids(proc) == ()  # nothing proves the sleep is the group started
        out = _tool("pids", "--pgid", str(proc.pgid), "--start-ticks", str(proc.start_ticks))
        assert "leader is gone" in json.loads(out.stdout)["error"]
        assert group_pids(proc.pgid) == left
    finally:
        for pid in left:
            os.kill(pid, signal.SIGKILL)


def test_the_group_it_started_is_signalled_once_proven(tmp_path):
    runner = LocalRunner()
    proc = runner.start_detached(["sleep", "300"], log_path=str(tmp_path / "log"))
    assert proc.start_ticks is not None and proc.boot_id == boot_id()
    try:
        assert not runner.signal_group(replace(proc, start_ticks=proc.start_ticks + 1), "KILL")
        assert not runner.signal_group(replace(proc, start_ticks=None), "KILL")  # nothing to prove it by
        assert runner.group_pids(replace(proc, start_ticks=proc.start_ticks + 1)) == ()
        assert runner.group_pids(replace(proc, start_ticks=None)) == ()
        assert runner.group_pids(proc) == (proc.pid,)
        assert _alive(proc.pid)
        assert runner.signal_group(proc, "TERM")
        deadline = time.monotonic() + 10
        while group_pids(proc.pgid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert group_pids(proc.pgid) == []
        assert not runner.signal_group(proc, "KILL")  # nothing left to signal
    finally:
        if _alive(proc.pid):
            os.killpg(proc.pgid, signal.SIGKILL)
