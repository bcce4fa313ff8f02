"""Failure diagnosis on logs and events captured from a real 2-node CPU run in which rank 1 was
SIGKILLed: rank 0 reported its symptom (gloo "Connection reset by peer") before node 1's
torchelastic printed the root cause. The cause must win over the symptom that came first."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from taehv_console.core.run.failure import (
    NodeEvidence,
    attempt_log_text,
    choose_failure,
    is_peer_symptom,
    parse_root_cause,
    port_in_use,
    tail_lines,
)
from taehv_console.core.run.recovery import CauseKind, classify

FIX = Path(__file__).with_name("fixtures")


def _evidence():
    killed = parse_root_cause((FIX / "node-1-rank-killed.log").read_text())
    peer = parse_root_cause((FIX / "node-0-peer-failed.log").read_text())
    return [NodeEvidence(0, "127.0.0.2", 1, 1002.0, peer), NodeEvidence(1, "127.0.0.3", 1, 1003.0, killed)]


def test_root_cause_block_is_parsed_from_a_real_log():
    rc = parse_root_cause((FIX / "node-1-rank-killed.log").read_text())
    assert (rc.rank, rc.local_rank, rc.exit_code, rc.host) == (1, 0, -9, "localhost")
    assert rc.lines[0].startswith("Root Cause") and rc.lines[-1].startswith("  traceback")
    assert not any(line.startswith("=====") for line in rc.lines)  # stops at the closing rule
    assert parse_root_cause("no block here\n") is None


def test_the_killed_rank_is_the_cause_even_when_its_peer_failed_first():
    peer_error = json.loads((FIX / "rank-0-peer-error.json").read_text())
    assert is_peer_symptom(peer_error["message"])  # gloo's wording of a vanished peer
    nodes = _evidence()
    # node 0 even exited first here: arrival order must not decide
    nodes[0] = NodeEvidence(0, "127.0.0.2", 1, 999.0, nodes[0].root_cause)
    f = choose_failure(nodes, {0: peer_error}, gpus_per_node=1, now=1005.0)
    assert (f.node, f.host, f.rank, f.exit_code) == (1, "127.0.0.3", 1, -9)
    assert "SIGKILL" in f.reason and any("Root Cause" in line for line in f.log_lines)


def test_a_signal_in_the_block_is_the_cause_while_its_launcher_is_still_exiting():
    """Recorded on a loaded 2-core host (one node, two ranks, rank 1 SIGKILLed): rank 0's gloo
    error at 41.25 s, torchelastic's block at 41.6 s, and the launcher still tearing down when the
    console's 2 s settle ran out. The block's signal, not the peer's words, is the cause."""
    text = attempt_log_text(FIX / "node-0-rank-1-killed-launcher-running.log", 0, 1)
    peer_error = json.loads((FIX / "rank-0-gloo-closed.json").read_text())
    assert is_peer_symptom(peer_error["message"])
    running = NodeEvidence(0, "localhost", None, None, parse_root_cause(text), tail_lines(text))
    f = choose_failure([running], {0: peer_error}, gpus_per_node=2, now=peer_error["time"] + 2.1)
    assert (f.kind, f.node, f.rank, f.local_rank, f.exit_code) == ("signal", 0, 1, 1, -9), f
    assert classify(f).kind is CauseKind.SIGNAL and classify(f).node == 0
    # a launcher that exited 0 said its ranks ended well, whatever an old block says
    done = NodeEvidence(0, "localhost", 0, 50.0, running.root_cause)
    assert choose_failure([done], {0: peer_error}, gpus_per_node=2, now=60.0).kind == "symptom"


def test_a_ranks_own_error_beats_launcher_exit_order():
    nodes = [NodeEvidence(0, "a", 1, 10.0, None), NodeEvidence(1, "b", 1, 11.0, None)]
    errors = {
        3: {"message": "CUDA error: invalid device ordinal", "time": 12.0},
        0: {"message": "Connection closed by peer [10.0.0.2]:1234", "time": 9.0},
    }
    f = choose_failure(nodes, errors, gpus_per_node=2, now=20.0)
    assert (f.rank, f.node, f.host, f.local_rank) == (3, 1, "b", 1)
    assert "invalid device ordinal" in f.reason


def test_without_a_root_cause_the_first_launcher_to_fail_is_named_with_its_log_tail():
    nodes = [NodeEvidence(0, "a", 0, 10.0, None), NodeEvidence(1, "b", 2, 11.0, None, ("boom",))]
    f = choose_failure(nodes, {}, gpus_per_node=1, now=20.0)
    assert (f.node, f.exit_code, f.log_lines) == (1, 2, ("boom",))


def test_a_vanished_launcher_and_no_failure_at_all():
    nodes = [NodeEvidence(0, "a", None, None, None)]
    f = choose_failure(nodes, {}, 1, 5.0, vanished=[(0, "a")])
    assert f.node == 0 and "without an exit status" in f.reason
    assert choose_failure(nodes, {}, 1, 5.0) is None


def test_only_this_attempts_part_of_a_log_is_read(tmp_path):
    log = tmp_path / "node-0.log"
    log.write_text(
        "[taehv-console] t node 0 attempt 1 on h (pid 1): x\nRoot Cause (first observed failure):\n"
        "  rank      : 0 (local_rank: 0)\n  exitcode  : -9 (pid: 5)\n=========\n"
        "[taehv-console] t node 0 attempt 2 on h (pid 2): x\nall fine\n"
    )
    assert parse_root_cause(attempt_log_text(log, 0, 2)) is None  # attempt 1's failure is history
    assert parse_root_cause(attempt_log_text(log, 0, 1)).exit_code == -9


def test_a_ranks_words_beat_a_bare_launcher_exit_code():
    # torchrun signalled itself prints no root-cause block; the rank said what went wrong
    nodes = [NodeEvidence(0, "a", 1, 10.0, None, ("Traceback ...", "SignalException: got signal: 15"))]
    errors = {0: {"message": "DataLoader worker (pid 7) is killed by signal: Terminated.", "time": 9.0}}
    f = choose_failure(nodes, errors, gpus_per_node=1, now=20.0)
    assert f.rank == 0 and "DataLoader worker" in f.reason and f.exit_code == 1


def test_a_taken_rendezvous_port_is_the_cause_and_is_retried_without_blaming_the_node():
    """Recorded: node 0's launcher found the run's port held by another process, in accelerate's
    own check (a multi-node launch) and in torchrun's TCPStore (the check passed, the bind did
    not). No rank ran; node 1's ranks would only time out waiting for a rendezvous."""
    for name, port in (("accelerate", 45055), ("torchrun", 40847)):
        text = attempt_log_text(FIX / f"node-0-port-taken-{name}.log", 0, 2)
        taken = port_in_use(text)
        assert taken is not None and taken[0] == port, (name, taken)
        node0 = NodeEvidence(0, "n1", 1, 100.0, parse_root_cause(text), tail_lines(text), taken)
        node1 = NodeEvidence(1, "n2", None, None, None)
        f = choose_failure([node0, node1], {}, gpus_per_node=1, now=101.0)
        assert (f.kind, f.node, f.host, f.rank) == ("port-in-use", 0, "n1", None), (name, f)
        assert f"port {port} is taken" in f.reason and str(port) in f.log_lines[0], f
        cause = classify(f)
        # retried (the relaunch moves to a free port), and not a strike against node 0's hardware
        assert (cause.kind, cause.retryable, cause.node) == (CauseKind.PORT_IN_USE, True, None), cause
    assert port_in_use("RuntimeError: something else entirely\n") is None
    # the rank killed by a signal still comes first: its port was free, its rank ran
    killed = _evidence()
    f = choose_failure([*killed[:1], replace(killed[1], port_taken=(1, "stale"))], {}, 1, now=1005.0)
    assert f.kind == "signal", f
