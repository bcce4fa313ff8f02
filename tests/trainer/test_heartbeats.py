"""Heartbeats are written at most once a second: a training step's beat within a second of the last
write is only recorded, and the collective watch's thread writes the newest one; a slower step's
beat is written as it comes, as before. A rank that stops stepping stops producing new beats, so
the console's stall bound sees the same silence as before."""

from __future__ import annotations

import json
import time

import pytest

from taehv_console.core.forensics.selfdump import dump_by_signal, parse_faulthandler
from tests.trainer.runs import BF16_CROP, Launch, base_config, events, write_run
from trainer.events import CollectiveWatch, EventWriter, stacks_path


def _beat(writer: EventWriter) -> dict:
    return json.loads(writer.heartbeat_path.read_text())


def test_a_step_beat_is_recorded_then_written_once_by_the_flush(tmp_path):
    w = EventWriter(tmp_path, 0)
    w.heartbeat(0)  # the start: written at once
    assert _beat(w)["step"] == 0
    w.heartbeat(1, now=False, step_time_s=0.5)
    w.heartbeat(2, now=False, step_time_s=0.4)
    assert _beat(w)["step"] == 0  # nothing written on the step path
    w.flush_heartbeat()
    assert _beat(w)["step"] == 2 and _beat(w)["step_time_s"] == 0.4  # the newest, not each
    written = w.heartbeat_path.stat().st_mtime_ns
    w.flush_heartbeat()
    assert w.heartbeat_path.stat().st_mtime_ns == written  # no new beat: no write, the time stays old
    time.sleep(1.1)
    w.heartbeat(3, now=False)  # a second after the last write: a slow step's beat is written at once
    assert _beat(w)["step"] == 3


def test_the_watch_thread_writes_step_beats_within_about_a_second_and_says_when_a_rank_waits(tmp_path):
    w = EventWriter(tmp_path, 1)
    w.heartbeat(0)
    watch = CollectiveWatch(w, after_s=2.0)
    try:
        w.heartbeat(5, now=False)
        deadline = time.time() + 5
        while _beat(w)["step"] != 5 and time.time() < deadline:
            time.sleep(0.1)
        assert _beat(w)["step"] == 5
        watch.enter("all_reduce")
        deadline = time.time() + 8
        while "waiting_op" not in _beat(w) and time.time() < deadline:
            time.sleep(0.1)
        assert _beat(w)["waiting_op"] == "all_reduce" and _beat(w)["step"] == 5
    finally:
        watch.leave()
        watch.close()


def test_nested_waits_tell_the_outermost_and_end_with_it(tmp_path):
    w = EventWriter(tmp_path, 0)
    w.heartbeat(0)
    watch = CollectiveWatch(w, after_s=0.5)
    try:
        with watch.waiting("barrier"):
            with watch.waiting("deepspeed.barrier"):
                pass
            assert watch._since is not None  # the inner call's end did not end the outer wait
            deadline = time.time() + 5
            while "waiting_op" not in _beat(w) and time.time() < deadline:
                time.sleep(0.05)
            assert _beat(w)["waiting_op"] == "barrier"
        assert watch._since is None
    finally:
        watch.close()


class _Mark:
    """The CUDA boundary (trainer.runtime.CudaMark) as the watch sees it: where the stream was marked,
    and whether the device has got past the newest mark."""

    def __init__(self) -> None:
        self.records = 0
        self.passed = False

    def record(self) -> None:
        self.records += 1
        self.passed = False

    def done(self) -> bool:
        return self.passed


def test_on_a_device_a_collective_it_does_not_get_past_is_told_as_the_wait(tmp_path):
    """On NCCL a collective call returns at once and the host blocks later, in a read the trainer
    does not mark (DeepSpeed's overflow and norm checks). The watch tells the newest collective as
    the wait when the device has not passed it for 2 s and 1.5 step times, with no step finished
    since; a device merely behind its host is not waiting."""
    w = EventWriter(tmp_path, 0)
    mark = _Mark()
    watch = CollectiveWatch(w, after_s=0.6, device=mark)
    try:
        w.heartbeat(7, step_time_s=0.2)
        time.sleep(0.01)
        watch.issued("deepspeed.reduce_scatter_tensor")
        at = watch._issued[1]
        assert mark.records == 1
        deadline = time.time() + 5
        while "waiting_op" not in _beat(w) and time.time() < deadline:
            time.sleep(0.05)
        told = _beat(w)
        assert told["waiting_op"] == "deepspeed.reduce_scatter_tensor" and told["step"] == 7, told
        assert told["waiting_since"] == at and told["time"] - at >= 0.6, told
        # the device got past it: nothing to tell
        mark.passed = True
        assert watch.blocked(now=at + 60) is None
        mark.passed = False
        assert watch.blocked(now=at + 0.5) is None  # not yet 0.6 s
        w.heartbeat(8, step_time_s=4.0)  # a step finished after the collective: its beat is newer
        assert watch.blocked(now=at + 60) is None
        watch.issued("deepspeed.all_reduce")
        at = watch._issued[1]
        assert watch.blocked(now=at + 5.9) is None  # within 1.5 step times (4 s) of the call
        assert watch.blocked(now=at + 6.1) == ("deepspeed.all_reduce", at)

        def broken() -> bool:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        mark.done = broken  # type: ignore[method-assign]
        assert watch.blocked(now=at + 6.1) is None  # nothing told, and the thread goes on
        w.heartbeat(9, now=False)
        deadline = time.time() + 3
        while _beat(w)["step"] != 9 and time.time() < deadline:
            time.sleep(0.05)
        assert _beat(w)["step"] == 9 and watch._thread.is_alive()
    finally:
        watch.close()


def test_without_a_device_a_returned_call_is_not_a_wait(tmp_path):
    """On gloo (no device) the call itself was the wait: once it returns there is nothing to tell."""
    w = EventWriter(tmp_path, 0)
    w.heartbeat(3, step_time_s=0.1)
    watch = CollectiveWatch(w, after_s=0.5)
    try:
        time.sleep(0.01)
        watch.issued("deepspeed.all_reduce")
        assert watch.blocked(now=time.time() + 60) is None
    finally:
        watch.close()


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_a_rank_held_up_inside_deepspeeds_backward_says_it_waits(tmp_path, clip_dir, stage):
    """bf16 ZeRO reads nothing back between forward and backward, so when rank 1 stalls before its
    backward, rank 0 blocks in DeepSpeed's own collectives (the gradient reduction; ZeRO-3's
    parameter gathers and reduce-scatter, whose async handles are waited on later). Rank 0's
    heartbeat must say it waits, and in which of DeepSpeed's calls: without that the console cannot
    tell it from the stalled rank (a SIGSTOP in the middle of backward looks the same)."""
    from trainer.runtime import DEEPSPEED_COLLECTIVES

    run = write_run(
        tmp_path / "run",
        base_config(
            clip_dir,
            data=BF16_CROP,
            optim={"max_steps": 4},
            deepspeed={"zero_stage": stage, "mixed_precision": "bf16"},
        ),
    )
    launch = Launch(run, 2, env={"TAEHV_FAULTS": "stall:1:2:8"})
    beat = run / "heartbeat" / "rank-0.json"
    told: dict = {}
    try:
        deadline = time.time() + 400
        while launch.proc.poll() is None and time.time() < deadline:
            try:
                b = json.loads(beat.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                b = {}
            if b.get("waiting_op") and b.get("step", 0) >= 2:  # the stalled step, not start-up
                told = b
                break
            time.sleep(0.2)
        if told:  # meanwhile the stalled rank gives its own stack (what forensics takes without py-spy)
            stalled_pid = json.loads((run / "heartbeat" / "rank-1.json").read_text())["pid"]
            own = dump_by_signal(stalled_pid, stacks_path(run, 1))
        assert launch.wait() == 0, launch.tail()
    finally:
        launch.kill()
    assert told, f"rank 0 never said it waits while rank 1 stalled before backward\n{launch.tail()}"
    op = told["waiting_op"]
    assert op.startswith("deepspeed.") and op.removeprefix("deepspeed.") in DEEPSPEED_COLLECTIVES, told
    assert told["step"] == 2 and told["time"] - told["waiting_since"] >= 2.0 - 0.1, told
    assert events(run, 0, "stop")[-1]["reason"] == "done"  # the dump's signal did not disturb it
    assert own["kind"] == "ok", own
    main = parse_faulthandler(own["text"], stalled_pid, own["main"]).main_thread()
    assert main is not None and main.frames[0].startswith("sleep (") and "trainer/faults.py" in main.frames[0]
    assert any("trainer/train.py" in f for f in main.frames), main.frames


def test_deepspeeds_collectives_are_marked_once_by_the_newest_watch(tmp_path, monkeypatch):
    """Wrapping the backend a second time (a second runtime in one process) replaces the first
    watch's marks instead of stacking them, and a real gloo call through deepspeed.comm is marked."""
    import torch
    import torch.distributed as dist
    from deepspeed import comm as ds_dist
    from deepspeed.comm import comm as ds_comm

    from tests.trainer.runs import free_port
    from trainer.runtime import (
        DEEPSPEED_COLLECTIVES,
        skip_deepspeed_shm_op,
        watch_deepspeed_collectives,
    )

    one_process = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    for k, v in {**one_process, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(k, v)  # restored after the test: later tests launch with this environment
    skip_deepspeed_shm_op()  # as the trainer's ranks do: no JIT build of DeepSpeed's CPU shm op
    ds_dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    try:
        first = CollectiveWatch(EventWriter(tmp_path / "a", 0))
        second = CollectiveWatch(EventWriter(tmp_path / "b", 0))
        assert set(watch_deepspeed_collectives(first)) <= set(DEEPSPEED_COLLECTIVES)
        assert "all_reduce" in watch_deepspeed_collectives(second)
        seen: list[tuple[str, str]] = []
        for w, name in ((first, "first"), (second, "second")):
            w.enter = lambda op, name=name: seen.append((name, op))  # type: ignore[method-assign]
            w.leave = lambda: None  # type: ignore[method-assign]
            w.issued = lambda op, name=name: seen.append((name, "issued " + op))  # type: ignore[method-assign]
        ds_dist.all_reduce(torch.ones(2))
        ds_dist.barrier()
        assert seen == [
            ("second", "deepspeed.all_reduce"),
            ("second", "issued deepspeed.all_reduce"),  # on NCCL the device marks where it stands
            ("second", "deepspeed.barrier"),
            ("second", "issued deepspeed.barrier"),
        ]
        handle = ds_dist.all_reduce(torch.ones(2), async_op=True)
        assert seen[-1] == ("second", "deepspeed.all_reduce")  # queued, not yet joined: no mark
        seen.clear()
        handle.wait()  # an async call's wait is where a rank blocks: marked too
        assert seen == [("second", "deepspeed.all_reduce"), ("second", "issued deepspeed.all_reduce")]
        first.close()
        second.close()
    finally:
        for name in DEEPSPEED_COLLECTIVES:  # leave the backend as DeepSpeed made it
            m = getattr(ds_comm.cdb, name, None)
            if m is not None and hasattr(m, "taehv_unwatched"):
                setattr(ds_comm.cdb, name, m.taehv_unwatched)
        dist.destroy_process_group()
        ds_comm.cdb = None
