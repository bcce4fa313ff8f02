"""Run directories, state.json and the run lock, on the real filesystem and real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from taehv_console.core.models import BackendKind
from taehv_console.core.run.lock import RunBusyError, RunLock, is_locked
from taehv_console.core.run.rundir import RunNotFoundError, create_run_dir, new_run_id, resolve_run
from taehv_console.core.run.state import (
    Attempt,
    Exclusion,
    Failure,
    NodeLauncher,
    Phase,
    RunState,
    StateError,
    read_state,
    write_state,
)


def test_run_ids_are_readable_sortable_and_unique(tmp_path):
    t = time.mktime((2026, 11, 22, 2, 31, 45, 0, 0, -1))
    assert new_run_id("16gpu-H100 (derived)", t) == "20261122-023145-16gpu-h100-derived"
    a, b = create_run_dir(tmp_path, "cpu-smoke", t), create_run_dir(tmp_path, "cpu-smoke", t)
    assert a.run_id == "20261122-023145-cpu-smoke" and b.run_id == a.run_id + "-2"
    assert a.logs.is_dir()


def test_resolve_run_by_path_id_prefix_and_newest(tmp_path):
    runs = tmp_path / "runs"
    old = create_run_dir(runs, "cpu-smoke", 1_000_000_000.0)
    new = create_run_dir(runs, "8gpu-h100", 1_900_000_000.0)
    for r in (old, new):
        r.run_toml.write_text("")
    assert resolve_run(None, runs) == new
    assert resolve_run(old.run_id, runs) == old
    assert resolve_run(str(old.path), runs) == old and resolve_run(str(old.run_toml), runs) == old
    assert resolve_run(new.run_id[:12], runs) == new
    with pytest.raises(RunNotFoundError, match="no run 'nope'"):
        resolve_run("nope", runs)
    with pytest.raises(RunNotFoundError, match="no runs in"):
        resolve_run(None, tmp_path / "empty")


def test_state_round_trips_and_ignores_fields_it_does_not_know(tmp_path):
    state = RunState(
        run_id="r",
        phase=Phase.FAILED,
        backend="ssh",
        hosts=("a", "b"),
        attempts=(Attempt(1, 5.0, (NodeLauncher(0, "a", 10, 10, "/l"),), event_offsets=((0, 7),)),),
        failure=Failure("boom", node=1, rank=3, log_lines=("x", "y")),
        env=(("K", "V"),),
        controlled=(0, 1),
        spares=("c",),
        exclusions=(
            Exclusion(
                node=1,
                host="b0",
                why="node-lost: node 1 cannot be reached",
                time=4.0,
                attempt=1,
                replaced_by="b",
                nodes_before=2,
                nodes_after=2,
                changes=("node 1: b0 -> spare b",),
            ),
        ),
    )
    path = tmp_path / "state.json"
    written = write_state(path, state)
    assert written.updated > 0 and not list(tmp_path.glob(".*tmp"))  # replaced, no temp left behind
    back = read_state(path)
    assert back == written
    data = json.loads(path.read_text())
    data["from_a_newer_console"] = 1
    data["attempts"][0]["also_new"] = True
    path.write_text(json.dumps(data))
    assert read_state(path).attempts[0].event_offsets == ((0, 7),)
    path.write_text("{half")
    with pytest.raises(StateError, match=r"state\.json: damaged: not JSON"):
        read_state(path)


def test_the_backend_is_a_kind_in_memory_and_its_value_on_disk(tmp_path):
    path = tmp_path / "state.json"
    write_state(path, RunState(run_id="r", phase=Phase.CREATED, backend="slurm", hosts=("n1",)))
    back = read_state(path)
    assert back.backend is BackendKind.SLURM and back.backend.slurm  # dispatch on the member, not a string
    assert json.loads(path.read_text())["backend"] == "slurm"
    data = json.loads(path.read_text())
    data["backend"] = "mpirun"  # hand-edited, or a newer console's kind
    path.write_text(json.dumps(data))
    with pytest.raises(StateError, match=r"state\.json: damaged: field backend: .*'mpirun'"):
        read_state(path)


def test_a_second_lock_is_refused_with_the_holder_named(tmp_path):
    path = tmp_path / "lock"
    with RunLock(path, "launch"):
        assert is_locked(path)
        with pytest.raises(RunBusyError) as err:
            RunLock(path).acquire()
        assert f"pid {os.getpid()}" in str(err.value) and "(launch)" in str(err.value)
    assert not is_locked(path)
    RunLock(path).acquire().release()


def test_a_killed_holder_never_leaves_a_stale_lock(tmp_path):
    path = tmp_path / "lock"
    code = (
        "import sys, time; from taehv_console.core.run.lock import RunLock; "
        f"RunLock({str(path)!r}, 'console').acquire(); print('held', flush=True); time.sleep(300)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert is_locked(path)
        with pytest.raises(RunBusyError):
            RunLock(path).acquire()
        holder.send_signal(signal.SIGKILL)  # a console killed mid-run: the kernel drops its lock
        holder.wait()
        with RunLock(path, "attach") as lock:
            assert lock.held
    finally:
        holder.kill()
