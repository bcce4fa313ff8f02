"""The one view at scale (issue 12): 2,048 ranks' heartbeat files on shared storage. A tick over
unchanged files scans the directory once and opens none of them; a changed file is read and shows
in the view; a rank whose file stops changing is still named stalled, since staleness comes from
the clock, not from reading; and views built incrementally tick after tick equal a view of the
same ingested facts with every cache dropped."""

from __future__ import annotations

import builtins
import copy
import json
import os
import pickle
import time
from pathlib import Path

import pytest

from taehv_console.core.watch.health import AssessMemo
from taehv_console.core.watch.monitor import Monitor
from taehv_console.core.watch.state import RankState
from trainer.events import atomic_write_text

RANKS = 2048
GPUS_PER_NODE = 8


class HeartbeatDir:
    """2,048 ranks' heartbeat files as the trainer writes them (atomically replaced), 8 ranks per host."""

    def __init__(self, run: Path):
        self.run = run
        (run / "heartbeat").mkdir(parents=True)
        (run / "run.toml").write_text(
            f"[topology]\nnodes = {RANKS // GPUS_PER_NODE}\ngpus_per_node = {GPUS_PER_NODE}\n"
        )
        self.steps = dict.fromkeys(range(RANKS), 0)

    def beat(self, ranks, at: float) -> None:
        for r in ranks:
            self.steps[r] += 1
            atomic_write_text(
                self.run / "heartbeat" / f"rank-{r}.json",
                json.dumps(
                    {
                        "step": self.steps[r],
                        "time": at,
                        "pid": 10_000 + r,
                        "host": f"node-{r // GPUS_PER_NODE:03d}",
                        "step_time_s": 0.5,
                        "wait_s": 0.05,
                    }
                ),
            )


class Reads:
    """Counts the heartbeat files opened and the scans of the heartbeat directory."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.opened: list[str] = []
        self.scans = 0
        real_open, real_scandir = builtins.open, os.scandir

        def counting_open(file, *args, **kwargs):
            if "/heartbeat/" in str(file):
                self.opened.append(Path(file).name)
            return real_open(file, *args, **kwargs)

        def counting_scandir(path="."):
            if str(path).rstrip("/").endswith("heartbeat"):
                self.scans += 1
            return real_scandir(path)

        monkeypatch.setattr(builtins, "open", counting_open)
        monkeypatch.setattr(os, "scandir", counting_scandir)

    def reset(self) -> None:
        self.opened.clear()
        self.scans = 0


@pytest.fixture
def hb(tmp_path) -> HeartbeatDir:
    return HeartbeatDir(tmp_path / "run")


def test_unchanged_heartbeats_are_not_opened_and_a_changed_one_is(hb, monkeypatch):
    t0 = time.time() - 5.0
    hb.beat(range(RANKS), t0)
    mon = Monitor(hb.run, agents=False)
    reads = Reads(monkeypatch)
    first = mon.poll_once(t0 + 1.0)
    assert len(reads.opened) == RANKS and len(first.ranks) == RANKS
    assert all(r.state is RankState.HEALTHY and r.step == 1 for r in first.ranks)

    reads.reset()
    memo_hits = mon.builder.memo.reused
    view = mon.poll_once(t0 + 2.0)
    assert reads.opened == [] and reads.scans == 1  # one scan of the directory, not 2,048 reads
    assert mon.builder.memo.reused > memo_hits  # nothing new: the step statistics were kept
    assert view.rank(1234).heartbeat_age_s == pytest.approx(2.0)  # ages still follow the clock

    hb.beat([1234], t0 + 2.5)
    reads.reset()  # the opens the writer made are not the monitor's
    view = mon.poll_once(t0 + 3.0)
    assert reads.opened == ["rank-1234.json"] and reads.scans == 1
    assert view.rank(1234).step == 2 and view.rank(1234).heartbeat_age_s == pytest.approx(0.5)
    assert view.rank(1233).step == 1 and view.run.step == 2


def test_a_rank_whose_file_stops_changing_is_named_stalled_without_reading_it(hb, monkeypatch):
    t0 = time.time() - 60.0
    hb.beat(range(RANKS), t0)
    mon = Monitor(hb.run, agents=False)
    mon.poll_once(t0 + 0.5)
    laggard = 777
    hb.beat([r for r in range(RANKS) if r != laggard], t0 + 1.0)  # everyone finished step 2 but rank 777
    reads = Reads(monkeypatch)
    view = mon.poll_once(t0 + 1.5)
    assert laggard not in {int(n[5:-5]) for n in reads.opened} and len(reads.opened) == RANKS - 1
    assert view.rank(laggard).state is RankState.HEALTHY and view.collective is None

    reads.reset()
    view = mon.poll_once(t0 + 30.0)  # nothing written since: every rank is silent, 777 behind
    assert reads.opened == []
    assert [r.rank for r in view.stalled] == [laggard]
    assert view.collective is not None and view.collective.laggard_rank == laggard
    assert view.rank(0).blocked_by == laggard and view.run.phase == "stalled"
    assert view.node(view.rank(laggard).node).state.value == "stalled"


def test_incremental_views_equal_a_view_built_without_the_caches(hb):
    t0 = time.time() - 100.0
    hb.beat(range(RANKS), t0)
    mon = Monitor(hb.run, agents=False)
    mon.poll_once(t0 + 1.0)
    for i in range(1, 6):  # a few ticks in which different ranks move on; a slow one falls behind
        hb.beat([r for r in range(RANKS) if r % (i + 1) == 0 and r != 42], t0 + i)
        mon.poll_once(t0 + i + 0.5)
    at = t0 + 40.0
    inc = mon.poll_once(at)
    # the same ingested facts, every derived part computed anew
    mon.builder.memo = AssessMemo()
    mon.builder._step_summary = None
    mon.ingest._obs_cache.clear()
    for t in mon.ingest.ranks.values():
        t._recent = None
    ref = mon.poll_once(at)
    assert inc.ranks == ref.ranks
    assert inc.nodes == ref.nodes and inc.collective == ref.collective and inc.run == ref.run
    assert inc.rank(42).state is RankState.STALLED and inc.collective is not None  # a stall is compared too


@pytest.mark.parametrize("maxlen", [1, 15, 16, 17, 120])
def test_a_gpu_history_snapshot_shares_its_blocks_and_holds_the_newest_points(maxlen):
    """A view's GPU utilisation series are snapshots of each GPU's PointHistory. A snapshot holds
    the history's frozen blocks (not a copy of every point, which at 2,048 GPUs was a fifth of a
    view's cost), reads as exactly the newest `maxlen` points, and does not change when the history
    goes on."""
    from taehv_console.core.watch.state import PointHistory, Series

    hist, points, snaps = PointHistory(maxlen), [], []
    for i in range(5 * maxlen + 40):
        points.append((float(i), float(i % 97)))
        hist.append(points[-1])
        snap = hist.series("node-000/3")
        assert snap.last == points[-1][1]  # the newest point, before anything is flattened
        snaps.append((snap, tuple(points[-maxlen:])))
        assert len(hist) == min(len(points), maxlen)
    for snap, expected in snaps:  # read after the history moved on: each still says what it saw
        assert snap.points == expected and snap == Series("node-000/3", expected)
        assert hash(snap) == hash(Series("node-000/3", expected))
    big = snaps[-1][0]
    assert big._blocks is None  # flattened once on first read, then kept
    # copies (dataclasses.asdict deep-copies what is not a dataclass) and pickles are equal series
    unread = hist.series("node-000/3")
    for copied in (copy.copy(unread), copy.deepcopy(unread), pickle.loads(pickle.dumps(unread))):
        assert copied == unread and copied.points == tuple(points[-maxlen:])
    with pytest.raises(AttributeError):
        big.name = "other"
