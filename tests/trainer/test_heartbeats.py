"""Heartbeats are written at most once a second: a training step's beat within a second of the last
write is only recorded, and the collective watch's thread writes the newest one; a slower step's
beat is written as it comes, as before. A rank that stops stepping stops producing new beats, so
the console's stall bound sees the same silence as before."""

from __future__ import annotations

import json
import time

from trainer.events import CollectiveWatch, EventWriter


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
