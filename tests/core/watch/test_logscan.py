"""Log signals on captured lines: the NCCL watchdog (SeqNum, op, timeout, last completed work per
rank), NCCL WARN, torchelastic's root cause, invalid device ordinal, out of memory; and the noise
of healthy runs (NCCL INFO, deprecations, DeepSpeed's memory-pressure warning) raising nothing.
torchrun_kill9_cpu.log and healthy_cpu_run.log were captured from real runs on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from taehv_console.core.logscan import LogScanner, scan_line
from taehv_console.core.watch.health import watchdog_counts
from tests.core.watch.conftest import FIXTURES

LOGS = FIXTURES / "logs"


def scan(name: str):
    sc = LogScanner()
    lines = (LOGS / name).read_text().splitlines()
    return sc.feed(name, lines, now=5.0) + sc.flush(name, now=5.0)


def kinds(sigs):
    return [(s.kind, s.rank) for s in sigs]


def test_watchdog_timeout_once_per_rank_with_its_numbers():
    sigs = scan("nccl_watchdog_16rank_node1.log")
    wd = [s for s in sigs if s.kind == "watchdog_timeout"]
    # rank 8's line is printed three times (line, thread exception, terminate what()): one signal
    assert [(s.rank, s.line) for s in wd] == [(8, 2), (9, 7)]
    assert dict(wd[0].fields) == {"seq": 6463, "op": "ALLREDUCE", "timeout_ms": 7200000, "ran_ms": 7200081}
    assert (
        wd[0].severity == "error" and wd[0].seen == 5.0 and wd[0].source == "nccl_watchdog_16rank_node1.log"
    )


def test_last_completed_work_per_rank_names_the_laggard():
    sigs = scan("nccl_watchdog_16rank_node1.log")
    counts = watchdog_counts(sigs)
    assert counts == {8: 6462, 9: 6462, 11: 6461}
    assert min(counts, key=counts.get) == 11  # rank 11 never finished work 6462: it is the one stuck
    dump = next(s for s in sigs if s.kind == "nccl_progress" and s.rank == 11)
    assert dump.get("timeout_from_rank") == 8 and dump.severity == "info"  # evidence, not a second alarm


def test_root_cause_block_names_rank_host_exit_and_signal():
    sigs = scan("nccl_watchdog_16rank_node1.log")
    root = [s for s in sigs if s.kind == "root_cause"]
    assert len(root) == 1  # the "Failures:" block above it lists victims, not the cause
    r = root[0]
    assert (r.rank, r.host, r.get("exitcode"), r.get("pid"), r.get("local_rank")) == (
        8,
        "gpu-node-2",
        -6,
        24811,
        0,
    )
    assert "SIGABRT" in r.text and r.line == 35
    child = next(s for s in sigs if s.kind == "child_failed")
    assert (child.get("exitcode"), child.get("local_rank"), child.get("pid")) == (-6, 0, 24811)


def test_captured_kill9_of_a_cpu_rank():
    sigs = scan("torchrun_kill9_cpu.log")
    assert kinds(sigs) == [("peer_lost", None), ("child_failed", None), ("root_cause", 1)]
    root = sigs[-1]
    assert root.get("exitcode") == -9 and root.get("pid") == 32338 and "SIGKILL" in root.text
    assert sigs[0].severity == "warning"  # the surviving rank's side of the crash: a victim, not a cause


def test_nccl_warn_lines_and_nccl_out_of_memory():
    sigs = scan("nccl_warn_ib.log")
    assert [s.kind for s in sigs] == ["nccl_warn", "nccl_warn", "cuda_oom"]
    ib = sigs[0]
    assert ib.host == "gpu-node-2" and ib.get("pid") == 24813 and ib.get("device") == 2
    assert ib.get("where") == "transport/net_ib.cc:1295" and ib.get("message").startswith(
        "NET/IB : Got completion"
    )
    assert sigs[2].severity == "error" and sigs[2].get("pid") == 24812


def test_cuda_out_of_memory_in_both_torch_formats():
    sigs = scan("cuda_oom.log")
    assert [(s.kind, s.rank, s.line) for s in sigs] == [("cuda_oom", 3, 9), ("cuda_oom", None, 10)]


def test_invalid_device_ordinal_with_its_rank():
    sigs = scan("invalid_device_ordinal.log")
    assert kinds(sigs) == [("invalid_device_ordinal", 9), ("child_failed", None), ("root_cause", 9)]


@pytest.mark.parametrize("name", ["benign_noise.log", "healthy_cpu_run.log"])
def test_noise_of_healthy_runs_raises_nothing(name):
    assert scan(name) == []


@pytest.mark.parametrize(
    "line",
    [
        "gpu-node-1:24811:24811 [0] NCCL INFO NCCL_DEBUG set by environment to WARN",
        "gpu-node-1:24811:25131 [0] NCCL INFO NCCL_IB_TIMEOUT set by environment to 22.",
        (
            "[rank0]:[W1003 17:59:58.612330918 ProcessGroupNCCL.cpp:4115] Warning: Environment variable "
            "NCCL_ASYNC_ERROR_HANDLING is deprecated; use TORCH_NCCL_ASYNC_ERROR_HANDLING instead (function operator())"
        ),
        "distributed.collective_timeout_s = 7200",
        "[taehv-train] rank 5: skipped /data/videos/out_of_memory_test.mp4: corrupt video",
    ],
)
def test_lines_that_look_alarming_but_are_not(line):
    assert scan_line(line) is None


def test_watchdog_line_glued_to_the_previous_output_is_still_found():
    # seen in real logs: stderr of two threads interleaved without a newline between them
    line = (
        "                      ^^^^^^^^^^^^^^^^^^^^^[rank1]:[E1003 18:37:01.832146912 ProcessGroupNCCL.cpp:607] "
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=6463, OpType=ALLREDUCE, "
        "NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800017 milliseconds before timing out."
    )
    hit = scan_line(line)
    assert hit is not None and hit.kind == "watchdog_timeout" and hit.rank == 1


def test_a_rank_killed_in_the_second_torchrun_names_its_peer_is_the_root_cause():
    # recorded in CI: rank 1 kill -9'd, rank 0 exited 1 on the closed gloo connection, and torchrun
    # saw both in one poll, so its tie-break by rank called rank 0 the root cause
    lines = (LOGS / "torchrun_kill9_same_second_cpu.log").read_text().splitlines()
    assert any("rank      : 0" in ln for ln in lines[lines.index("Root Cause (first observed failure):") :])
    (root,) = [s for s in scan("torchrun_kill9_same_second_cpu.log") if s.kind == "root_cause"]
    assert (root.rank, root.get("exitcode"), root.get("torchrun_root_rank")) == (1, -9, 0)
    assert "SIGKILL" in root.text and "torchrun named rank 0" in root.text
    assert root.line == lines.index("Root Cause (first observed failure):") + 1


def test_root_cause_block_split_across_reads_and_flushed_when_the_file_goes_quiet():
    lines = (LOGS / "torchrun_kill9_cpu.log").read_text().splitlines()
    cut = next(i for i, ln in enumerate(lines) if "exitcode  : -9" in ln)
    sc = LogScanner()
    first = sc.feed("node-0.log", lines[:cut])
    assert "root_cause" not in [s.kind for s in first] and sc.pending() == ["node-0.log"]
    rest = sc.feed("node-0.log", lines[cut:-1])  # the closing ===== line not written yet
    assert "root_cause" not in [s.kind for s in rest]
    flushed = sc.flush("node-0.log")
    assert [(s.kind, s.rank, s.get("exitcode")) for s in flushed] == [("root_cause", 1, -9)]
    assert flushed[0].line == next(i for i, ln in enumerate(lines) if "Root Cause" in ln) + 1


def test_a_replaced_log_starts_its_line_numbers_again():
    sc = LogScanner()
    sc.feed("node-0.log", ["a", "b"])
    sc.reset("node-0.log")
    sig = sc.feed("node-0.log", ["RuntimeError: CUDA error: invalid device ordinal"])[0]
    assert sig.line == 1


def test_fixtures_are_the_ones_the_tests_describe():
    # guard against an emptied fixture making the noise test pass vacuously
    for name in ("benign_noise.log", "healthy_cpu_run.log"):
        assert len(Path(LOGS / name).read_text().splitlines()) >= 15
