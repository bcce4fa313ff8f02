"""Stall forensics wiring: when the view names a rank stalled, the run watch runs StallForensics
once (on its own thread), the report lands in RUN/forensics/, and the next view carries the rank's
py-spy stack. Real processes and real py-spy; the run directory is written as the trainer writes
it (rank 1 silent, rank 0 blocked in a collective)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from taehv_console.core.cluster.ssh import SshPool, SshSettings
from taehv_console.core.models import BackendKind
from taehv_console.core.watch.health import HealthPolicy
from taehv_console.core.watch.monitor import MonitorConfig, PollerConfig
from taehv_console.core.watch.runwatch import RunWatch
from taehv_console.core.watch.state import RankState

# a stand-in rank whose stack says where it is stuck
STUCK = "import time\ndef load_next_batch():\n    time.sleep(600)\nload_next_batch()\n"


def test_a_confirmed_stall_gets_one_forensics_report_with_the_stalled_ranks_stack(tmp_path):
    run = tmp_path / "run"
    (run / "heartbeat").mkdir(parents=True)
    procs = [subprocess.Popen([sys.executable, "-c", STUCK]) for _ in range(2)]
    try:
        now = time.time()
        for r, p in enumerate(procs):
            beat = {
                "step": 7,
                "time": now - 40,
                "pid": p.pid,
                "host": socket.gethostname(),
                "step_time_s": 0.5,
                "wait_s": 0.1,
            }
            if r == 0:  # blocked in the all-reduce, waiting for rank 1
                beat.update(time=now - 1, waiting_since=now - 38, waiting_op="all_reduce")
            (run / "heartbeat" / f"rank-{r}.json").write_text(json.dumps(beat))
        fast = PollerConfig(0.2, 10.0)
        cfg = MonitorConfig(
            events=fast, heartbeats=fast, publish_interval_s=0.2, health=HealthPolicy(stall_floor_s=5.0)
        )
        calls = []
        with SshPool(SshSettings.from_env()) as pool:
            watch = RunWatch(run, pool, BackendKind.LOCAL, ("localhost",), agents=False, config=cfg)
            real = watch.responder.forensics.collect
            watch.responder.forensics.collect = lambda *a, **kw: calls.append(a) or real(*a, **kw)
            watch.start()
            try:
                deadline, view = time.time() + 60, None
                while time.time() < deadline:
                    view = watch.view()
                    if view.forensics_for(1) is not None and view.forensics_for(1).frames:
                        break
                    time.sleep(0.2)
                time.sleep(1.0)  # more views of the same stall: no second collection
            finally:
                watch.stop()
        assert view is not None and view.rank(1).state is RankState.STALLED, view.rank(1) if view else None
        assert view.rank(0).blocked_by == 1 and "not in a collective" in view.rank(1).detail
        report = view.forensics_for(1)
        assert report is not None and report.pid == procs[1].pid
        assert any("load_next_batch" in f for f in report.frames), report.frames
        assert report.report.startswith("forensics/report-rank-1-") and (run / report.report).is_file()
        assert len(calls) == 1 and calls[0][0].rank == 1 and calls[0][1].rank == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_change_of_the_runs_hosts_gets_a_pipeline_for_the_new_hosts(tmp_path):
    """A node left out (or a spare in its place) changes state.json's hosts: the watch that follows
    the run watches the new ones from its next view on, and its subscribers keep getting views."""
    run = tmp_path / "run"
    (run / "heartbeat").mkdir(parents=True)
    fast = PollerConfig(0.2, 10.0)
    cfg = MonitorConfig(events=fast, heartbeats=fast, publish_interval_s=0.2)
    hosts = ["gpu-a", "gpu-b"]
    with SshPool(SshSettings.from_env()) as pool:
        watch = RunWatch(
            run, pool, BackendKind.SSH, tuple(hosts), agents=False, config=cfg, hosts_of=lambda: tuple(hosts)
        )
        seen: list[tuple[str, ...]] = []
        watch.subscribe(lambda view: seen.append(tuple(n.name for n in view.nodes)))
        watch.start()
        try:
            first = watch.monitor
            assert first.hosts == ["gpu-a", "gpu-b"] and not watch.follow_hosts()
            hosts[1] = "spare-c"
            watch.view()
            assert watch.monitor is not first and watch.monitor.hosts == ["gpu-a", "spare-c"]
            assert watch.responder.hosts == ["gpu-a", "spare-c"]
            seen.clear()
            beat = {"step": 1, "time": time.time(), "pid": 1, "host": "gpu-a", "step_time_s": 0.5}
            (run / "heartbeat" / "rank-0.json").write_text(json.dumps(beat))  # news to publish
            deadline = time.time() + 20
            while not any("spare-c" in h for h in seen) and time.time() < deadline:
                time.sleep(0.1)
            assert any("spare-c" in h for h in seen), seen
            del hosts[1]  # then left out altogether: one node
            assert watch.follow_hosts() and watch.monitor.hosts == ["gpu-a"]
        finally:
            watch.stop()
