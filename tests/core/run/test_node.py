"""The node-side tool on real processes: the wrapper records who it is and how its launcher ended;
a launcher's tree includes processes that left its group (torchrun's ranks each lead a session),
never another process of the same user; a reused pid is not taken for the run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from taehv_console.core.run import node
from tests.core.run.conftest import alive, wait_for

pytestmark = pytest.mark.timeout(60)

# A launcher-shaped process tree: this process leads its group; its child starts a session of
# its own (as torchrun does for every rank) and that child has a child in turn.
TREE = """
import subprocess, sys, time
sub = subprocess.Popen([sys.executable, "-c",
    "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"], start_new_session=True)
print(sub.pid, flush=True)
time.sleep(300)
"""


def test_wrapper_records_identity_and_the_launchers_exit_code(tmp_path):
    status = tmp_path / "node-3.status.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "taehv_console.core.run.node",
            "launch",
            "--status",
            str(status),
            "--node",
            "3",
            "--attempt",
            "2",
            "--",
            "sh",
            "-c",
            "echo hello; exit 7",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        start_new_session=True,
        check=False,
        # as srun starts it: the step a stop signals with scancel is recorded
        env={**os.environ, "SLURM_JOB_ID": "41", "SLURM_STEP_ID": "2"},
    )
    assert proc.returncode == 7
    st = json.loads(status.read_text())
    assert (st["node"], st["attempt"], st["exit_code"], st["slurm_step"]) == (3, 2, 7, "41.2")
    assert st["pid"] == st["pgid"] and st["start_ticks"] > 0 and st["ended"] >= st["started"]
    assert "node 3 attempt 2" in proc.stdout and "hello" in proc.stdout  # the header a failure parse keys on


def test_wrapper_survives_the_group_sigterm_and_records_the_signal(tmp_path):
    status = tmp_path / "s.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taehv_console.core.run.node",
            "launch",
            "--status",
            str(status),
            "--node",
            "0",
            "--",
            "sleep",
            "60",
        ],
        start_new_session=True,
    )
    wait_for(lambda: status.exists(), 20, "the status file")
    os.killpg(proc.pid, signal.SIGTERM)  # what a stop sends: the launcher dies, the wrapper reports it
    assert proc.wait(20) == 128 + signal.SIGTERM
    assert json.loads(status.read_text())["exit_code"] == -signal.SIGTERM


def test_tree_reaches_a_child_in_its_own_session_and_nothing_unrelated(tmp_path):
    leader = subprocess.Popen(
        [sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    unrelated = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        ranked = int(leader.stdout.readline())
        wait_for(lambda: len(node.run_tree(leader.pid)) >= 3, 10, "the whole tree")
        tree = node.run_tree(leader.pid)
        assert leader.pid in tree and ranked in tree and tree[ranked] == ranked  # its own group
        assert unrelated.pid not in tree and os.getpid() not in tree
        # TERM goes to the launcher's group only (torchrun forwards it to its ranks itself)
        out = node.signal_tree(leader.pid, signal.SIGTERM, whole_tree=False)
        assert out["signalled"] == [leader.pid]
        leader.wait(10)
        assert alive(ranked)  # not in that group: still there, which is why KILL walks the tree
    finally:
        node.kill_tree(ranked)  # by the group it leads, which is known here
        leader.kill()
        unrelated.kill()


def test_orphans_of_a_dead_launcher_stay_in_the_wrappers_tree(tmp_path):
    # the wrapper is a child subreaper: when the launcher dies first (SIGTERM to the group, a
    # crash), its ranks are re-parented to the wrapper, so a later SIGKILL still finds them
    status = tmp_path / "s.json"
    wrapper = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taehv_console.core.run.node",
            "launch",
            "--status",
            str(status),
            "--node",
            "0",
            "--",
            sys.executable,
            "-c",
            TREE,
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    unrelated = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        line = wrapper.stdout.readline()
        while not line.strip().isdigit():  # past the wrapper's header (it shows the command)
            line = wrapper.stdout.readline()
        ranked = int(line)
        wait_for(lambda: len(node.run_tree(wrapper.pid)) >= 4, 10, "the whole tree")
        members = list(node.run_tree(wrapper.pid))
        os.killpg(wrapper.pid, signal.SIGTERM)
        wait_for(
            lambda: json.loads(status.read_text()).get("exit_code") is not None, 10, "the launcher's exit"
        )
        tree = node.run_tree(wrapper.pid, json.loads(status.read_text())["start_ticks"])
        assert ranked in tree and wrapper.pid in tree  # orphaned, not lost
        assert node.kill_tree(wrapper.pid)["left"] == []
        assert not any(alive(p) for p in members)
        assert alive(unrelated.pid)
    finally:
        wrapper.kill()
        unrelated.kill()


def test_kill_takes_the_whole_tree_while_the_leader_lives(tmp_path):
    leader = subprocess.Popen(
        [sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    unrelated = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        ranked = int(leader.stdout.readline())
        wait_for(lambda: len(node.run_tree(leader.pid)) >= 3, 10, "the whole tree")
        members = list(node.run_tree(leader.pid))
        out = node.kill_tree(leader.pid, node.start_ticks(leader.pid))
        assert out["left"] == [] and ranked in out["signalled"] and leader.pid in out["signalled"]
        leader.wait(10)
        assert not any(alive(p) for p in members)
        assert alive(unrelated.pid)
    finally:
        unrelated.kill()
        leader.kill()


def test_a_reused_leader_pid_is_not_taken_for_the_run():
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        real = node.start_ticks(p.pid)
        assert node.run_tree(p.pid, real) == {p.pid: p.pid}
        # the recorded start time says another process held this pid: nothing here is the run's
        assert node.run_tree(p.pid, real - 1) == {}
        assert node.kill_tree(p.pid, real - 1)["signalled"] == []
        time.sleep(0.1)
        assert alive(p.pid)
    finally:
        p.kill()


def test_init_and_own_group_are_refused():
    parser = node.build_parser()
    assert "error" in node.tree_command(parser.parse_args(["kill", "--pgid", "1", "--signal", "KILL"]))
    assert "error" in node.tree_command(parser.parse_args(["pids", "--pgid", "0"]))
