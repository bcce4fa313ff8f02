"""The recovery decision on recorded inputs: failures as the controller diagnoses them (from real
torchrun logs where the fixture exists), histories of attempts, and the policy's edges."""

from __future__ import annotations

from pathlib import Path

import pytest

from taehv_console.core.run.failure import NodeEvidence, choose_failure, parse_root_cause, tail_lines
from taehv_console.core.run.recovery import (
    Action,
    Cause,
    CauseKind,
    PastAttempt,
    backoff_s,
    classify,
    decide,
    stall_bound_s,
)
from taehv_console.core.run.state import Failure
from trainer.config import RecoverySection

LOGS = Path(__file__).parents[1] / "watch" / "fixtures" / "logs"
POLICY = RecoverySection(max_restarts=3, backoff_s=10, backoff_max_s=360, exclude_after=2)


def diagnosed(log: str, errors: dict | None = None) -> Failure:
    text = (LOGS / log).read_text()
    node = NodeEvidence(0, "n0", 1, 100.0, parse_root_cause(text), tail_lines(text))
    failure = choose_failure([node], errors or {}, 2, 101.0)
    assert failure is not None
    return failure


def test_a_rank_killed_by_a_signal_in_a_real_torchrun_log_is_restarted_and_its_node_struck():
    cause = classify(diagnosed("torchrun_kill9_same_second_cpu.log"))
    assert cause.kind is CauseKind.SIGNAL and cause.retryable and cause.node == 0
    d = decide(POLICY, cause, added_checkpoint=True)
    assert d.action is Action.RESTART and (d.restart, d.of, d.delay_s) == (1, 3, 10)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("ValueError: injected failure", CauseKind.EXCEPTION),
        ("FileNotFoundError: [Errno 2] No such file or directory: '/data/videos'", CauseKind.EXCEPTION),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", CauseKind.EXCEPTION),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", CauseKind.DEVICE),
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970",
            CauseKind.COMMUNICATION,
        ),
        (
            "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer",
            None,
        ),
    ],
)
def test_a_trainer_error_is_retried_only_when_its_words_say_communication_or_device(message, kind):
    failure = choose_failure([], {1: {"message": message, "time": 5.0}}, 2, 10.0)
    assert failure is not None
    cause = classify(failure)
    # a peer's complaint alone (the gloo connection closed) is a symptom: someone else failed
    expected = kind or CauseKind.COMMUNICATION
    assert cause.kind is expected
    assert cause.retryable is (expected is not CauseKind.EXCEPTION)
    if not cause.retryable:
        d = decide(POLICY, cause, added_checkpoint=True)
        assert d.action is Action.FAIL and d.final and "would fail the same way" in d.reason


def test_a_full_disk_is_never_restarted():
    failure = choose_failure(
        [],
        {0: {"message": "OSError: [Errno 28] No space left on device: '/runs/x/ckpt'", "time": 1.0}},
        1,
        2.0,
    )
    assert classify(failure).kind is CauseKind.DISK_FULL
    assert decide(POLICY, classify(failure), added_checkpoint=True).action is Action.FAIL


def test_a_lost_node_and_a_stall_are_restarted():
    lost = choose_failure([], {}, 1, 3.0, vanished=[(1, "n1")])
    assert classify(lost).kind is CauseKind.NODE_LOST and classify(lost).node == 1
    stall = Failure(reason="rank 3 stalled for 200 s", node=1, rank=3, kind="stall")
    assert decide(POLICY, classify(stall), added_checkpoint=False).action is Action.RESTART


def past(n: int, added: bool = True, node: int | None = None) -> list[PastAttempt]:
    return [PastAttempt(CauseKind.SIGNAL, node, added) for _ in range(n)]


def test_the_budget_is_spent_after_max_restarts_and_the_run_gives_up():
    cause = Cause(CauseKind.SIGNAL, "signal: rank 1", node=None)
    assert decide(POLICY, cause, True, past(2)).action is Action.RESTART
    d = decide(POLICY, cause, True, past(3))
    assert d.action is Action.GIVE_UP and d.final and "3 of 3 used" in d.reason


def test_two_attempts_in_a_row_without_a_checkpoint_give_up():
    cause = Cause(CauseKind.SIGNAL, "signal: rank 1")
    assert decide(POLICY, cause, False, past(1, added=True)).action is Action.RESTART
    d = decide(POLICY, cause, False, past(1, added=False))
    assert d.action is Action.GIVE_UP and "no checkpoint" in d.reason


def test_backoff_doubles_up_to_its_cap():
    assert [backoff_s(POLICY, k) for k in (1, 2, 3, 4, 5, 6, 7)] == [10, 20, 40, 80, 160, 320, 360]
    cause = Cause(CauseKind.SIGNAL, "x")
    assert decide(POLICY, cause, True, past(2)).delay_s == 40


def test_recovery_off_ends_failed_without_saying_do_not_retry():
    off = RecoverySection(max_restarts=0)
    d = decide(off, Cause(CauseKind.SIGNAL, "x"), True)
    assert d.action is Action.END and not d.final
    assert decide(off, Cause(CauseKind.EXCEPTION, "x"), True).final  # a bug is final either way


def test_strikes_leave_a_node_out_only_where_the_backend_can_and_min_nodes_allows():
    cause = Cause(CauseKind.SIGNAL, "signal: node 1", node=1)
    # the first strike: a plain restart
    assert decide(POLICY, cause, True, (), nodes=2, can_exclude=True).action is Action.RESTART
    # the second strike against the same node: left out
    d = decide(POLICY, cause, True, past(1, node=1), nodes=2, can_exclude=True)
    assert d.action is Action.EXCLUDE and d.node == 1 and "2 strikes" in d.reason
    # min_nodes keeps it
    keep = RecoverySection(max_restarts=3, min_nodes=2)
    assert decide(keep, cause, True, past(1, node=1), nodes=2, can_exclude=True).action is Action.RESTART
    # a backend that cannot relaunch without it says so and restarts
    d = decide(POLICY, cause, True, past(1, node=1), nodes=2, can_exclude=False)
    assert d.action is Action.RESTART and "cannot relaunch without a node" in d.reason


def test_a_device_fault_is_hardware_evidence_that_excludes_at_once():
    cause = Cause(CauseKind.DEVICE, "device: Xid 79", node=3)
    d = decide(POLICY, cause, True, (), nodes=8, can_exclude=True)
    assert d.action is Action.EXCLUDE and d.node == 3 and "hardware evidence" in d.reason


def test_the_stall_bound_scales_with_the_step_time_above_a_floor():
    auto = RecoverySection(stall_restart_after_s=0)
    assert stall_bound_s(auto, None) == 180 and stall_bound_s(auto, 1.2) == 180
    assert stall_bound_s(auto, 30.0) == 600  # 20 steps of a slow config
    assert stall_bound_s(RecoverySection(stall_restart_after_s=45), 30.0) == 45


def test_an_unknown_cause_in_an_old_state_file_reads_as_unknown():
    assert CauseKind.parse("") is CauseKind.UNKNOWN and CauseKind.parse("cosmic-ray") is CauseKind.UNKNOWN
    assert CauseKind.parse("stall") is CauseKind.STALL


def test_a_launcher_that_exited_without_a_word_is_not_restarted_but_not_final_either():
    failure = Failure(reason="the SLURM job ended with exit code 1", exit_code=1)
    cause = classify(failure)
    assert cause.kind is CauseKind.UNKNOWN and not cause.retryable
    d = decide(POLICY, cause, added_checkpoint=True)
    assert d.action is Action.END and not d.final


def test_a_node_that_cannot_be_reached_is_left_out_at_once_where_spares_or_min_nodes_allow():
    lost = classify(choose_failure([], {}, 1, 3.0, unreachable=[(1, "connection refused")]))
    assert (lost.kind, lost.node) == (CauseKind.NODE_LOST, 1)
    # the first strike, but the node does not answer: left out now, not after exclude_after strikes
    d = decide(POLICY, lost, True, (), nodes=2, can_exclude=True, unreachable={1})
    assert d.action is Action.EXCLUDE and d.node == 1 and "cannot be reached" in d.reason
    assert "goes on with 1 node(s)" in d.reason
    # a node that answers again is only struck
    assert decide(POLICY, lost, True, (), nodes=2, can_exclude=True).action is Action.RESTART
    # min_nodes keeps every node, unless a spare can take its place
    keep = RecoverySection(max_restarts=3, min_nodes=2)
    d = decide(keep, lost, True, (), nodes=2, can_exclude=True, unreachable={1})
    assert d.action is Action.RESTART and "no spare, and min_nodes = 2" in d.reason
    d = decide(keep, lost, True, (), nodes=2, can_exclude=True, spares=1, unreachable={1})
    assert d.action is Action.EXCLUDE and "a spare takes its place" in d.reason


# a root-cause block as torchrun writes it for a rank that exited 1 (not signalled)
EXITED = """Root Cause (first observed failure):
[0]:
  time      : 2026-11-26_05:34:40
  host      : n0
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
"""
PEER_LOST = {"message": "[gloo/transport/tcp/pair.cc:553] Connection closed by peer", "time": 99.0}


def exited_node0() -> NodeEvidence:
    rc = parse_root_cause(EXITED)
    assert rc is not None and rc.rank == 0 and rc.exit_code == 1
    return NodeEvidence(0, "n0", 1, 100.0, rc, tail_lines(EXITED))


def test_an_unreachable_node_explains_the_exits_of_the_others():
    # node 0's rank exited after a lost peer's symptom; node 1 does not answer
    f = choose_failure([exited_node0()], {0: PEER_LOST}, 1, 101.0, unreachable=[(1, "connection refused")])
    assert f is not None and (f.kind, f.node) == ("node-lost", 1) and "cannot be reached" in f.reason
    # a rank killed by a signal is still the cause, whatever else does not answer
    log = (LOGS / "torchrun_kill9_same_second_cpu.log").read_text()
    killed = NodeEvidence(0, "n0", 1, 100.0, parse_root_cause(log), tail_lines(log))
    signalled = choose_failure([killed], {}, 1, 101.0, unreachable=[(1, "x")])
    assert signalled is not None and signalled.kind == "signal"


def test_an_exit_after_a_lost_peers_symptom_is_a_communication_failure_not_a_bug():
    # node 0's launcher exited 1 with a root-cause block for rank 0, whose own words were a peer's
    # loss: restarting can get past it (it is not the trainer's own error)
    f = choose_failure([exited_node0()], {0: PEER_LOST}, 1, 101.0)
    assert f is not None and f.kind == "symptom"
    cause = classify(f)
    assert cause.kind is CauseKind.COMMUNICATION and cause.retryable and cause.node is None
    # the same exit with the rank's own error is the trainer's: not retried
    own = {"message": "ValueError: injected failure", "time": 99.0}
    assert classify(choose_failure([exited_node0()], {0: own}, 1, 101.0)).kind is CauseKind.EXCEPTION


@pytest.mark.parametrize(
    "frames, where",
    [
        # py-spy of a rank stuck in a queue's wait: the library frame, then the trainer's step
        (
            (
                "wait (threading.py:331)",
                "get (queue.py:180)",
                "next_batch (trainer/data.py:412)",
                "train_step (trainer/train.py:150)",
            ),
            "wait (threading.py:331), called from next_batch (trainer/data.py:412)",
        ),
        # faulthandler writes full paths; the innermost frame is already the trainer's own
        (
            ("sleep (/work/main/trainer/faults.py:71)", "train_step (/work/main/trainer/train.py:154)"),
            "sleep (/work/main/trainer/faults.py:71)",
        ),
        # nothing of the trainer's in the stack (a rank stuck before it started): the innermost
        (("accept (socket.py:294)", "<module> (<string>:3)"), "accept (socket.py:294)"),
        ((), ""),
        # a package named like the trainer is not the trainer
        (("wait (x.py:1)", "f (my_trainer/a.py:2)"), "wait (x.py:1)"),
    ],
)
def test_where_a_stalled_rank_stands_is_its_innermost_frame_and_its_own_codes(frames, where):
    from taehv_console.core.run.recovery import where_stalled

    assert where_stalled(frames) == where
