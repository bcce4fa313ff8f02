"""Folding trainer events: the header values, bounded histories, attempts, checkpoint events,
notices; and the catch-up shortcut (skipping step lines that cannot matter) giving what parsing
every line gives."""

from __future__ import annotations

import json
import random
from dataclasses import asdict

from taehv_console.core.watch.events import EventFold, rank_of
from trainer.events import EventWriter


def _line(**ev) -> bytes:
    # the trainer's own format: compact separators
    return json.dumps(
        {"v": 1, "time": ev.pop("time", 1.0), "rank": ev.pop("rank", 0), **ev}, separators=(",", ":")
    ).encode()


def _step(step: int, **kw) -> bytes:
    return _line(
        kind="step",
        step=step,
        loss=1 / step,
        recon_loss=1 / step,
        psnr=20 + step / 1000,
        lr=1e-4,
        samples_per_s=100.0 + step % 7,
        step_time_s=0.5,
        nonfinite_skipped=kw.pop("nonfinite", 0),
        **kw,
    )


def _slow_fold(lines: list[bytes], history_len: int) -> EventFold:
    """The reference: every line parsed and applied in order."""
    f = EventFold(history_len)
    for ln in lines:
        try:
            ev = json.loads(ln)
        except ValueError:
            continue
        f.apply(0, ev)
    return f


def _view(f: EventFold) -> dict:
    return {
        "loss": list(f.loss),
        "psnr": list(f.psnr),
        "lr": list(f.lr),
        "clips": list(f.clips),
        "val": list(f.val),
        "last": f.last_step,
        "ranks": {r: asdict(e) for r, e in f.ranks.items()},
        "ckpt": f.checkpoints,
        "best": f.best_val_psnr,
        "data": f.data_skipped,
    }


def test_the_trainers_own_files_fold_into_header_values(tmp_path):
    w0, w1 = EventWriter(tmp_path, 0), EventWriter(tmp_path, 1)
    w0.emit(
        "start", world_size=2, node="n", local_rank=0, preset="p", resumed_from=None, max_steps=10, step=0
    )
    w1.emit(
        "start", world_size=2, node="n", local_rank=1, preset="p", resumed_from=None, max_steps=10, step=0
    )
    for s in (1, 2, 3):
        w0.emit(
            "step",
            step=s,
            loss=1 / s,
            recon_loss=1 / s,
            psnr=10 + s,
            lr=1e-3,
            grad_norm=1.0,
            samples_per_s=4.0,
            step_time_s=0.5,
            gpu_mem_gb=None,
            nonfinite_skipped=0,
        )
    w0.emit("val", step=3, psnr=15.5, ssim=0.5, n_clips=4)
    w0.emit("checkpoint", step=3, path="x", status="started", reason="interval")
    w0.emit("checkpoint", step=3, path="x", seconds=1.5, bytes=10, status="complete", reason="interval")
    w1.emit("data", step=2, path="/d/bad.mp4", reason="corrupt video", count=1)
    w1.emit("future_kind", anything=1)  # unknown kinds are ignored
    w1.emit("error", message="boom", traceback="...")
    for w in (w0, w1):
        w.close()
    f = EventFold(history_len=2)
    for r in (0, 1):
        p = tmp_path / "events" / f"rank-{r}.jsonl"
        assert rank_of(str(p)) == r
        f.feed(r, p.read_bytes().splitlines())
    assert f.last_step["step"] == 3 and [x for x, _ in f.loss] == [2.0, 3.0]  # bounded to the newest 2
    assert f.last_val["psnr"] == 15.5 and f.best_val_psnr == 15.5
    assert f.checkpoints[3]["status"] == "complete" and f.checkpoint_in_flight() is None
    assert f.last_checkpoint_seconds() == 1.5
    assert f.data_skipped == 1 and f.ranks[1].error == "boom" and f.ranks[0].error is None
    texts = [n.text for n in f.notices]
    assert any("started: world size 2" in t for t in texts) and any("rank 1: boom" in t for t in texts)
    assert any("skipped /d/bad.mp4" in t for t in texts) and any(
        "checkpoint step 3 complete" in t for t in texts
    )


def test_a_new_start_begins_a_new_attempt_for_that_rank():
    f = EventFold()
    f.feed(
        1,
        [
            _line(rank=1, kind="start", world_size=2),
            _line(rank=1, kind="error", message="oom"),
            _line(rank=1, kind="stop", reason="error", step=5),
        ],
    )
    assert f.ranks[1].error == "oom" and f.ranks[1].stop["reason"] == "error"
    f.feed(1, [_line(rank=1, kind="start", world_size=2, resumed_from="/r/checkpoints/step-4", step=4)])
    assert f.ranks[1].error is None and f.ranks[1].stop is None and f.ranks[1].attempts == 2


def test_save_in_flight_until_it_completes_or_fails():
    f = EventFold()
    f.feed(0, [_line(kind="checkpoint", step=10, status="started")])
    assert f.checkpoint_in_flight() == 10
    f.feed(0, [_line(kind="checkpoint", step=10, status="failed", message="disk full")])
    assert f.checkpoint_in_flight() is None
    assert f.notices[-1].severity == "error" and "disk full" in f.notices[-1].text


def test_rank_0s_compile_event_is_one_notice_and_a_cache_that_did_not_load_is_a_warning():
    f = EventFold()
    cache = {"folder": "/r/compile-cache/x", "loaded": 0, "hits": 0, "misses": 13, "saved": 14, "error": None}
    f.feed(0, [_line(kind="compile", step=1, first_step_s=48.2, cache=cache)])
    f.feed(1, [_line(rank=1, kind="compile", step=1, first_step_s=47.9, cache={**cache, "saved": 0})])
    assert [n.text for n in f.notices] == [
        "first step 48 s with compilation: 0 graphs from cache, 13 compiled"
    ]
    assert f.notices[-1].severity == "info"
    bad = {**cache, "error": "/r/compile-cache/x/part-1.bin: not a torch 2.13.0 compile cache (ignored)"}
    f.feed(0, [_line(time=2.0, kind="compile", step=4, first_step_s=50.0, cache=bad)])
    assert f.notices[-1].severity == "warning" and "part-1.bin: not a torch" in f.notices[-1].text


def test_bad_and_partial_lines_are_counted_not_fatal():
    f = EventFold()
    f.feed(0, [b"", b"{not json", b"[1,2]", _step(1)])
    assert f.bad_lines == 2 and f.last_step["step"] == 1
    assert [d.split(": damaged, skipped: ")[0] for d in f.damaged] == [
        "events/rank-0.jsonl line 2",
        "events/rank-0.jsonl line 3",
    ]
    assert "not JSON" in f.damaged[0] and "a JSON array where an event (an object) belongs" in f.damaged[1]


def test_catch_up_shortcut_equals_parsing_every_line():
    rng = random.Random(3)
    lines: list[bytes] = [_line(kind="start", world_size=8, max_steps=5000, step=0)]
    for s in range(1, 5001):
        lines.append(_step(s))
        if s % 500 == 0:
            lines.append(_line(kind="val", step=s, psnr=20 + rng.random()))
            lines.append(_line(kind="checkpoint", step=s, status="started"))
            lines.append(_line(kind="checkpoint", step=s, status="complete", seconds=2.0))
        if s % 777 == 0:
            lines.append(_line(kind="data", step=s, path=f"/v/{s}.mp4", reason="short video"))
        if s == 4000:  # a resume in the middle: steps repeat from the checkpoint
            lines.append(_line(kind="start", world_size=8, max_steps=5000, step=3500, resumed_from="x"))
    fast = EventFold(history_len=300)
    fast.feed(0, lines)  # one big catch-up batch
    slow = _slow_fold(lines, 300)
    assert _view(fast) == _view(slow)
    assert [n.text for n in fast.notices] == [n.text for n in slow.notices]
    # and fed in arbitrary pieces, as polls deliver it
    pieces = EventFold(history_len=300)
    i = 0
    while i < len(lines):
        n = rng.randint(1, 900)
        pieces.feed(0, lines[i : i + n])
        i += n
    assert _view(pieces) == _view(slow)


def test_non_finite_skips_inside_skipped_lines_come_out_as_one_notice_with_the_count():
    lines = [_step(s, nonfinite=0 if s < 10 else (1 if s < 20 else 2)) for s in range(1, 1001)]
    fast = EventFold(history_len=50)
    fast.feed(0, [_step(1)])
    fast.feed(0, lines[1:])
    notes = [n.text for n in fast.notices if "non-finite" in n.text]
    assert notes == ["step 951: non-finite loss, micro-batch skipped (2 so far)"]
    # followed live (small batches: every line parsed), each skip is its own notice
    live = EventFold(history_len=50)
    for ln in lines:
        live.feed(0, [ln])
    assert [n.text for n in live.notices if "non-finite" in n.text] == [
        "step 10: non-finite loss, micro-batch skipped (1 so far)",
        "step 20: non-finite loss, micro-batch skipped (2 so far)",
    ]


def test_step_lines_of_other_ranks_do_not_feed_the_histories():
    f = EventFold()
    f.feed(3, [_step(7, rank=3)])
    assert f.last_step is None and not f.loss


def test_a_writer_with_spaces_takes_the_full_path_and_gives_the_same_result():
    spaced = [
        json.dumps({"v": 1, "time": 1.0, "rank": 0, "kind": "step", "step": s, "loss": 1.0 / s}).encode()
        for s in range(1, 2000)
    ]
    f = EventFold(history_len=10)
    f.feed(0, spaced)
    assert [x for x, _ in f.loss] == [float(s) for s in range(1990, 2000)] and f.last_step["step"] == 1999


def test_a_stop_read_twice_is_one_notice_but_a_second_stop_is_another():
    """After a stop the events pane said "rank 0 stopped at step 26: signal" twice: a file read
    again from its start feeds its lines again. One event is one notice; a later attempt's own
    stop at the same step (another time) is a notice of its own."""
    f = EventFold()
    stop = _line(kind="stop", step=26, reason="signal", time=50.0)
    f.feed(0, [_line(kind="start", world_size=2, max_steps=40, time=1.0), _step(26, time=49.0), stop])
    f.feed(0, [stop])  # the same line again (a re-read)
    texts = [n.text for n in f.notices]
    assert texts.count("rank 0 stopped at step 26: signal") == 1
    f.feed(
        0,
        [
            _line(kind="start", world_size=2, max_steps=40, time=60.0),
            _line(kind="stop", step=26, reason="signal", time=61.0),
        ],
    )
    assert [n.text for n in f.notices].count("rank 0 stopped at step 26: signal") == 2
