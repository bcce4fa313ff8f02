"""Flight Recorder: the launch environment (checked against the installed torch's own headers), the
analyser's verdict parsed from recorded runs of PyTorch's analyser, the analyser run for real on
dumps torch's recorder wrote, and the pipe trigger against stand-in ranks that do what
ProcessGroupNCCL's DumpPipe does (fake_nccl_rank.py; NCCL itself cannot run here)."""

from __future__ import annotations

import filecmp
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from taehv_console.core.cluster.ssh import SshPool, SshSettings
from taehv_console.core.forensics import RankRef, StallForensics
from taehv_console.core.forensics import flight_recorder as fr
from taehv_console.core.plan.flight_recorder import flight_recorder_env, paths_for, prepare_dirs
from tests.core.forensics.conftest import FIXTURES, make_run, sigstop, write_heartbeat

FAKE_RANK = Path(__file__).with_name("fake_nccl_rank.py")
DUMPS = FIXTURES / "fr_dumps"
NCCL_DUMPS = FIXTURES / "fr_dumps_nccl_h100"  # written by NCCL's watchdog on an H100
# found without importing torch (seconds of start-up for a path)
C10D_HEADERS = (
    Path(importlib.util.find_spec("torch").origin).parent
    / "include"
    / "torch"
    / "csrc"
    / "distributed"
    / "c10d"
)


# --------------------------------------------------------------------------------- environment


def test_env_sets_the_legacy_buffer_dump_on_timeout_and_run_dir_paths(tmp_path):
    run = tmp_path / "20261123-0500-16gpu-h100"
    env = flight_recorder_env(run)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"  # the legacy name: it alone creates the pipe
    assert "TORCH_FR_BUFFER_SIZE" not in env
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(run / "forensics" / "fr" / "live" / "trace_rank_")
    # the FIFO lives in the node's /tmp (always there), named after the run
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/tmp/taehv-fr-20261123-0500-16gpu-h100-rank_"


@pytest.mark.skipif(
    not (C10D_HEADERS / "ProcessGroupNCCL.hpp").is_file(), reason="torch ships no c10d headers"
)
def test_the_names_are_the_ones_installed_torch_reads():
    nccl = (C10D_HEADERS / "ProcessGroupNCCL.hpp").read_text()
    recorder = (C10D_HEADERS / "FlightRecorder.hpp").read_text()
    assert '"TORCH_NCCL_TRACE_BUFFER_SIZE"' in nccl and '"TORCH_NCCL_DUMP_ON_TIMEOUT"' in nccl
    assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" in nccl
    # the pipe's name and the condition for it
    assert 'c10::str(fileStem, rank, ".pipe")' in nccl and "traceBufferSize <= 0" in nccl
    assert "c10::str(namePrefix, rank)" in recorder  # dumps go to <TEMP_FILE><rank>


# ------------------------------------------------------------------------- recorded analyser runs


def test_parse_missing_rank_from_a_recorded_analysis():
    verdict = fr.parse_analysis((FIXTURES / "fr_analysis_missing_rank.txt").read_text())
    assert verdict == ("collective 4 (all_reduce, group 0:default_pg): missing ranks {1}",)


def test_parse_a_rank_without_dump_strict_and_incomplete():
    strict = fr.parse_analysis((FIXTURES / "fr_analysis_no_dump_strict.txt").read_text())
    assert strict == ("no Flight Recorder dump from ranks {1}",)
    loose = fr.parse_analysis((FIXTURES / "fr_analysis_no_dump_incomplete.txt").read_text())
    # four identical analyser lines become one
    assert loose == ("no Flight Recorder dump from ranks {1}: the analyser cannot decide what is wrong",)


def test_parse_culprits_of_a_mismatch():
    text = (
        "Collective sequence number: 7 has errors\ninternal record id: 6\ngroup info: 0:default_pg\n"
        "collective: nccl:all_gather\ncollective state: scheduled\n"
        "Culprit rank 3; Error type: SIZE_OR_SYNTAX_MISMATCH, Expected input sizes: '[[4]]' does not match "
        "found input sizes: '[[5]]'\n"
    )
    (line,) = fr.parse_analysis(text)
    assert line.startswith(
        "collective 7 (all_gather, group 0:default_pg): Culprit rank 3; Error type: SIZE_OR_SYNTAX_MISMATCH"
    )


def test_nothing_found_is_not_a_verdict():
    assert fr.parse_analysis("tabulate is not installed. Proceeding without it.\n") == ()


# ------------------------------------------------------------------------------ the real analyser


def test_real_analyser_on_real_recorder_dumps(tmp_path):
    verdict, raw = fr.analyse(DUMPS)
    assert verdict == ("collective 4 (all_reduce, group 0:default_pg): missing ranks {1}",)
    assert "Not all ranks joining collective" in raw


def test_real_analyser_when_a_rank_wrote_no_dump(tmp_path):
    (tmp_path / "trace_rank_0").write_bytes((DUMPS / "trace_rank_0").read_bytes())
    verdict, raw = fr.analyse(tmp_path, incomplete=True)
    assert "missed FR dumps from ranks ({1})" in raw
    assert verdict == (
        "no Flight Recorder dump from ranks {1}: the analyser cannot decide what is wrong",
        # the dump that is there still says where rank 0 waits
        (
            "rank 0: collective 4 (all_reduce, group 0:default_pg) enqueued and not completed (3 completed),"
            " called at <string>:9 <module>"
        ),
    )


def test_a_real_nccl_dump_where_every_rank_joined_says_what_still_waits(tmp_path):
    # On a real NCCL run, one rank's 4th all-reduce waited behind a kernel that never ended: the
    # analyser finds nothing wrong between ranks, and the dump's own status says where it stands.
    verdict, _raw = fr.analyse(NCCL_DUMPS)
    assert verdict == (
        "Flight Recorder: every rank joined every recorded collective",
        (
            "rank 0: collective 4 (all_reduce, group 0:default_pg) enqueued and not completed (3 completed),"
            " called at <string>:16 <module>"
        ),
    )
    dump = fr.read_dump(NCCL_DUMPS / "trace_rank_0")
    assert dump is not None and dump["comm_lib_version"] == "2.28.9"
    assert dump["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}}


def test_a_dump_that_would_run_code_is_not_read(tmp_path):
    import pickle

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    (tmp_path / "trace_rank_0").write_bytes(pickle.dumps({"entries": [Boom()]}))
    (tmp_path / "trace_rank_1").write_bytes(b"not a pickle")
    assert fr.read_dump(tmp_path / "trace_rank_0") is None
    assert fr.read_dump(tmp_path / "trace_rank_1") is None
    assert fr.pending_collectives(tmp_path) == ()
    assert not (tmp_path / "ran").exists()


def test_an_analyser_that_cannot_run_is_a_verdict_line(tmp_path):
    verdict, _ = fr.analyse(tmp_path, python="/bin/false")
    assert verdict == ("Flight Recorder analyser failed: exit 1",)


# ----------------------------------------------------------------------------- the pipe trigger


@pytest.fixture
def fake_ranks(tmp_path):
    """fake_ranks(run_dir, {rank: dump}) -> Popen per rank, each with the run's FR environment."""
    started, stems = [], set()

    def start(run: Path, dumps: dict[int, Path]):
        prepare_dirs(run)
        stems.add(paths_for(run).pipe_stem)
        env = {**os.environ, **flight_recorder_env(run)}
        procs = {}
        for rank, dump in dumps.items():
            p = subprocess.Popen(
                [sys.executable, str(FAKE_RANK), str(rank), str(dump)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            started.append(p)
            assert p.stdout.readline().strip() == "ready"
            procs[rank] = p
        return procs

    yield start
    for p in started:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait(timeout=10)
    for stem in stems:  # the pipes live in /tmp, named after the run (make_run's or the test's own)
        for p in Path(stem).parent.glob(f"{Path(stem).name}*.pipe"):
            p.unlink()


def test_trigger_copies_each_dump_away(tmp_path, fake_ranks):
    run = tmp_path / tmp_path.name
    run.mkdir()
    fake_ranks(run, {0: DUMPS / "trace_rank_0", 1: DUMPS / "trace_rank_1"})
    paths = paths_for(run)
    first = fr.dump_through_pipes(
        paths.pipe_stem, paths.trace_stem, [0, 1], str(run / "fr" / "a"), timeout=20
    )
    assert first["kind"] == "ok", first
    assert set(first["copied"]) == {"0", "1"} and first["missing"] == {}
    for r in (0, 1):
        assert filecmp.cmp(first["copied"][str(r)], DUMPS / f"trace_rank_{r}", shallow=False)
    # a second dump rewrites the live files; the first copies stay as they were
    second = fr.dump_through_pipes(
        paths.pipe_stem, paths.trace_stem, [0, 1], str(run / "fr" / "b"), timeout=20
    )
    assert set(second["copied"]) == {"0", "1"}
    assert Path(first["copied"]["0"]).exists() and Path(first["copied"]["0"]).parent.name == "a"


def test_trigger_says_why_a_rank_gave_nothing(tmp_path, fake_ranks):
    run = tmp_path / tmp_path.name
    run.mkdir()
    procs = fake_ranks(run, {0: DUMPS / "trace_rank_0", 1: DUMPS / "trace_rank_1"})
    sigstop(procs[1].pid)  # a stopped rank cannot dump
    paths = paths_for(run)
    os.mkfifo(f"{paths.pipe_stem}3.pipe")  # a pipe nobody reads: its rank is gone
    reply = fr.dump_through_pipes(
        paths.pipe_stem, paths.trace_stem, [0, 1, 2, 3], str(run / "fr" / "x"), timeout=3
    )
    assert set(reply["copied"]) == {"0"}
    assert "no dump within 3 s" in reply["missing"]["1"]
    assert "no pipe" in reply["missing"]["2"] and "TORCH_NCCL_TRACE_BUFFER_SIZE" in reply["missing"]["2"]
    assert "nobody reads" in reply["missing"]["3"]


def test_collect_on_an_nccl_run_names_the_missing_rank(tmp_path, fake_ranks):
    run = make_run(tmp_path, device="cuda", nodes=1, gpus_per_node=2)
    procs = fake_ranks(run, {0: DUMPS / "trace_rank_0", 1: DUMPS / "trace_rank_1"})
    for r, p in procs.items():
        write_heartbeat(run, r, step=5, pid=p.pid)
    with SshPool(SshSettings.from_env()) as pool:
        f = StallForensics(run, pool, fr_wait=20)
        partial = []
        report = f.collect(
            RankRef(1, 0, "localhost", procs[1].pid),
            RankRef(0, 0, "localhost", procs[0].pid),
            on_partial=partial.append,
        )
    assert report.flight_recorder == ("collective 4 (all_reduce, group 0:default_pg): missing ranks {1}",)
    fr_dir = Path(report.fr_dir)
    assert fr_dir.parent == run / "forensics" / "fr" and fr_dir.name.endswith("-rank1")
    assert sorted(p.name for p in fr_dir.iterdir()) == ["analysis.txt", "trace_rank_0", "trace_rank_1"]
    assert "missing ranks: {1}" in (fr_dir / "analysis.txt").read_text()
    # the stacks came first, before the Flight Recorder wait
    assert len(partial) == 1 and partial[0].flight_recorder == () and len(partial[0].dumps) == 2
    # the stand-in ranks load no libnccl: RAS says so
    assert any("NCCL RAS unavailable on node 0" in n and "no NCCL loaded" in n for n in report.notes)
    assert report.to_json()["flight_recorder"] == list(report.flight_recorder)


def test_flight_recorder_off_in_the_config_is_a_note(tmp_path):
    run = make_run(
        tmp_path, device="cuda", nodes=1, gpus_per_node=2, nccl_env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    )
    with SshPool(SshSettings.from_env()) as pool:
        report = StallForensics(run, pool).collect(
            RankRef(1, 0, "localhost", os.getpid()), None, communicators_ready=False
        )
    assert report.flight_recorder == ()
    assert any("Flight Recorder is off" in n for n in report.notes)
    assert any("NCCL RAS not asked" in n and "communicator init" in n for n in report.notes)


def test_collect_with_a_stopped_rank_says_it_wrote_no_dump(tmp_path, fake_ranks):
    run = make_run(tmp_path, device="cuda", nodes=1, gpus_per_node=2)
    procs = fake_ranks(run, {0: DUMPS / "trace_rank_0", 1: DUMPS / "trace_rank_1"})
    sigstop(procs[1].pid)
    with SshPool(SshSettings.from_env()) as pool:
        report = StallForensics(run, pool, fr_wait=3).collect(
            RankRef(1, 0, "localhost", procs[1].pid),
            RankRef(0, 0, "localhost", procs[0].pid),
            communicators_ready=False,
        )
    assert report.flight_recorder == (
        "no Flight Recorder dump from ranks {1}",
        (
            "rank 0: collective 4 (all_reduce, group 0:default_pg) enqueued and not completed"
            " (3 completed), called at <string>:9 <module>"
        ),
    )
    assert any("ranks [1] on node 0: no dump within 3 s" in n for n in report.notes)
    stalled = next(d for d in report.dumps if d.role == "stalled")
    assert stalled.process_state == "T" and "fake_nccl_rank.py" in stalled.frames[0]


def test_fr_dump_over_ssh_for_a_remote_node(sshd, tmp_path, fake_ranks):
    host = sshd.hosts[2].host
    run = make_run(tmp_path, device="cuda", nodes=1, gpus_per_node=2, hosts=(host,))
    procs = fake_ranks(run, {0: DUMPS / "trace_rank_0", 1: DUMPS / "trace_rank_1"})
    with SshPool(sshd.settings()) as pool:
        report = StallForensics(run, pool, fr_wait=20).collect(
            RankRef(1, 0, host, procs[1].pid), None, communicators_ready=False
        )
        assert host in pool._conns
    assert report.flight_recorder == ("collective 4 (all_reduce, group 0:default_pg): missing ranks {1}",)
    assert {d.host for d in report.dumps} == {host}
