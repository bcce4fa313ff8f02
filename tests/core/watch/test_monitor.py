"""The monitor on run directories written with the trainer's own EventWriter (real agents, real
files, real sshd; no training): snapshots, subscribers, scheduling, stalls from heartbeats, agents
lost and restarted, nodes over SSH. Real training runs are in test_live.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import threading
import time

import psutil
import pytest

from taehv_console.core.watch.monitor import Monitor, PollerConfig, snapshot_once
from taehv_console.core.watch.scheduling import CallPoller, FilesPoller, Scheduler
from taehv_console.core.watch.state import ClusterState, NodeState, RankState
from taehv_console.core.watch.tail import LocalFiles, Tailer
from tests.core.watch.conftest import FakeRun, fast_config, wait_state

HOST = socket.gethostname()


def test_snapshot_once_reads_a_run(fake_run):
    fake_run.start()
    for _ in range(5):
        fake_run.do_step(step_time=0.4)
    s = snapshot_once(fake_run.dir, config=fast_config(stall_floor_s=60))
    assert s.run.phase == "running" and s.run.step == 5 and s.run.max_steps == 100 and s.run.world_size == 2
    assert (
        s.run.loss == pytest.approx(0.2)
        and s.run.clips_per_s == pytest.approx(20.0)
        and s.run.preset == "test"
    )
    assert s.run.eta_s == pytest.approx(95 * 0.4)
    assert [r.state for r in s.ranks] == [RankState.HEALTHY] * 2 and [r.step for r in s.ranks] == [5, 5]
    assert (
        [n.name for n in s.nodes] == [HOST]
        and s.nodes[0].state is NodeState.OK
        and s.nodes[0].ranks == (0, 1)
    )
    assert s.history.loss.values == pytest.approx([1, 0.5, 1 / 3, 0.25, 0.2])
    assert {src.name for src in s.sources} == {"events", "heartbeats", "logs", "checkpoints"}
    assert all(src.ok for src in s.sources)
    json.dumps(s.to_dict())  # status --json
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.run = None  # type: ignore[misc]


def test_snapshot_once_with_a_one_shot_agent_sample(fake_run):
    fake_run.start()
    fake_run.do_step()
    s = snapshot_once(
        fake_run.dir, agents=True, config=fast_config(stall_floor_s=60)
    )  # the sample takes ~1 s
    n = s.nodes[0]
    assert n.sample is not None and n.sample.host == HOST and not n.sample.gpu_ok and n.state is NodeState.OK
    # this test process wrote the heartbeats: the agent found it as the run's process of both ranks
    assert {p.pid for p in n.sample.processes} == {os.getpid()}
    d = s.to_dict()
    assert d["nodes"][0]["sample"]["gpu_ok"] is False and d["ranks"][0]["state"] == "healthy"


def test_empty_run_directory_is_waiting_not_an_error(tmp_path):
    s = snapshot_once(tmp_path / "not-yet", config=fast_config())
    assert s.run.phase == "waiting" and s.ranks == () and s.nodes[0].state is NodeState.UNKNOWN


def test_finished_run_is_done_with_ranks_stopped(fake_run):
    fake_run.start()
    fake_run.do_step()
    fake_run.stop("done")
    s = snapshot_once(fake_run.dir, config=fast_config())
    assert s.run.phase == "done" and s.run.stop_reason == "done" and s.run.eta_s is None
    assert [r.state for r in s.ranks] == [RankState.STOPPED] * 2


def test_subscribers_are_called_on_change_only(fake_run):
    fake_run.start()
    fake_run.do_step()
    got: list[ClusterState] = []
    mon = Monitor(fake_run.dir, agents=False, config=fast_config(stall_floor_s=60))
    unsubscribe = mon.subscribe(got.append)

    def called_with(step: int) -> None:
        # the subscribers' call follows the snapshot: wait for it, not a fixed 0.3 s (a loaded
        # machine ran past that and the call landed inside the quiet window below)
        deadline = time.monotonic() + 5
        while not (got and got[-1].run.step == step) and time.monotonic() < deadline:
            time.sleep(0.05)

    with mon:
        # the first publication's call, not snapshot(): a snapshot asked before it is built on the
        # spot and calls nobody, and on a loaded machine step 2 then came before the first call
        called_with(1)
        for _ in range(3):
            fake_run.do_step()
            wait_state(mon, lambda s, n=fake_run.step: s.run.step == n, 5, f"step {fake_run.step}")
        called_with(4)
        time.sleep(0.2)  # a second call for the same change would come now
        n = len(got)
        assert [s.run.step for s in got][-1] == 4 and {s.run.step for s in got} >= {1, 4}
        time.sleep(1.0)  # nothing written: ten publish ticks, no new snapshot for subscribers
        assert len(got) == n
        unsubscribe()
        fake_run.do_step()
        time.sleep(0.5)
        assert len(got) == n and mon.snapshot().run.step == 5
    assert all(isinstance(s, ClusterState) for s in got) and [s.seq for s in got] == sorted(
        s.seq for s in got
    )


def test_a_broken_subscriber_does_not_stop_the_others(fake_run):
    fake_run.start()
    good: list[int] = []

    def broken(state):
        raise RuntimeError("widget gone")

    mon = Monitor(fake_run.dir, agents=False, config=fast_config())
    mon.subscribe(broken)
    mon.subscribe(lambda s: good.append(s.run.step or 0))
    with mon:
        fake_run.do_step()
        wait_state(mon, lambda s: s.run.step == 1, 5, "step 1")
        fake_run.do_step()
        wait_state(mon, lambda s: 2 in good, 5, "step 2 delivered")
        # reported in the notices of a following snapshot (the failing call came after this one was built)
        wait_state(
            mon,
            lambda s: any("subscriber failed: RuntimeError('widget gone')" in n.text for n in s.notices),
            5,
            "the failure noted",
        )


def test_polls_never_overlap_and_failures_back_off():
    running, overlaps, calls = [0], [0], {"slow": [], "bad": []}
    lock = threading.Lock()

    def slow():
        with lock:
            running[0] += 1
            overlaps[0] = max(overlaps[0], running[0])
        calls["slow"].append(time.monotonic())
        time.sleep(0.3)
        with lock:
            running[0] -= 1
        return False

    def bad():
        calls["bad"].append(time.monotonic())
        raise OSError("node unreachable")

    sched = Scheduler(workers=4)
    slow_p = CallPoller("slow", PollerConfig(0.01, 0.1), slow)  # due every 10 ms, takes 300 ms
    bad_p = CallPoller("bad", PollerConfig(0.05, 1.0, backoff_max_s=0.4), bad)
    sched.add(slow_p)
    sched.add(bad_p)
    sched.start()
    try:
        time.sleep(0.15)
        st = slow_p.status(time.monotonic())
        assert not st.ok and "timeout 0.1 s" in st.error  # a poll past its timeout shows on its source
        time.sleep(1.8)
    finally:
        sched.stop()
    assert overlaps[0] == 1  # rescheduled only after the previous poll ended
    gaps = [b - a for a, b in zip(calls["slow"], calls["slow"][1:])]
    assert all(g >= 0.3 for g in gaps) and 4 <= len(calls["slow"]) <= 7
    bad_gaps = [b - a for a, b in zip(calls["bad"], calls["bad"][1:])]
    assert bad_gaps[0] == pytest.approx(0.05, abs=0.04) and bad_gaps[1] == pytest.approx(0.1, abs=0.04)
    assert max(bad_gaps) < 0.5  # capped at backoff_max_s
    assert bad_p.error == "OSError: node unreachable" and bad_p.polls == len(calls["bad"])


def test_a_source_read_by_hand_while_the_scheduler_polls_it_hands_each_line_over_once(tmp_path):
    """Monitor.read_now (the last view of a run that just ended) polls sources the scheduler may be
    polling at that moment. The chunk source below holds a reader until a second one arrives (or
    0.5 s pass), so without one-poll-at-a-time both read from the same offset: the second sees the
    file go back and reports it replaced, and its lines come twice."""
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "rank-0.jsonl").write_bytes(b"1\n2\n3\n")
    meet = threading.Barrier(2, timeout=0.5)

    class Meeting(LocalFiles):
        def read(self, *args):
            try:
                meet.wait()
            except threading.BrokenBarrierError:
                pass  # alone: the other poll is done or waiting its turn
            return super().read(*args)

    applied = []
    poller = FilesPoller(
        "events",
        PollerConfig(1.0, 5.0),
        Tailer(tmp_path, Meeting(), append=["events/*.jsonl"]),
        lambda res, now, reader: applied.append(res),
        "local",
    )
    errors = []

    def poll():
        try:
            poller.run_once()
        except Exception as err:  # noqa: BLE001 - collected: a racing poll's bookkeeping can fail too
            errors.append(err)

    threads = [threading.Thread(target=poll) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert errors == []
    assert [line for res in applied for lines in res.lines.values() for line in lines] == [b"1", b"2", b"3"]
    assert not any(res.reset for res in applied) and poller.polls == 2


def test_rank_behind_by_a_step_is_named_the_laggard_from_heartbeats_alone(fake_run):
    fake_run.start()
    mon = Monitor(fake_run.dir, agents=False, config=fast_config(stall_floor_s=0.5))
    with mon:
        for _ in range(4):
            fake_run.do_step(step_time=0.2)
            time.sleep(0.2)
        fake_run.do_step(step_time=0.2, ranks=[0])  # rank 1 never finishes step 5; everyone then waits
        t0 = time.time()
        s = wait_state(
            mon,
            lambda s: s.collective is not None and s.collective.laggard_rank == 1,
            5,
            "a collective stall naming rank 1",
        )
        assert time.time() - t0 < 3 * 0.2 + 1.0
        assert s.rank(1).state is RankState.STALLED and s.rank(0).state is RankState.HEALTHY
        assert (
            s.rank(0).blocked_by == 1 and s.run.phase == "stalled" and s.nodes[0].state is NodeState.STALLED
        )
        assert any("collective stalled: waiting for rank 1" in n.text for n in s.notices)
        fake_run.do_step(step_time=0.2)  # it moves again
        s = wait_state(
            mon, lambda s: s.collective is None and s.rank(1).state is RankState.HEALTHY, 5, "recovery"
        )
        assert s.nodes[0].state is NodeState.OK and s.run.phase == "running"


def test_histories_are_bounded(tmp_path):
    run = FakeRun(tmp_path / "run")
    try:
        run.start()
        for _ in range(30):
            run.do_step()
        cfg = dataclasses.replace(fast_config(), history_len=5)
        s = snapshot_once(run.dir, config=cfg)
        assert [x for x, _ in s.history.loss.points] == [26.0, 27.0, 28.0, 29.0, 30.0]
    finally:
        run.close()


def test_a_rank_on_another_machine_becomes_its_own_node_in_local_mode(fake_run):
    fake_run.start()
    fake_run.do_step()
    fake_run.beat(1, host="gpu-elsewhere", step_time_s=0.2, wait_s=0.0)
    s = snapshot_once(fake_run.dir, config=fast_config())
    assert [(n.name, n.ranks) for n in s.nodes] == [(HOST, (0,)), ("gpu-elsewhere", (1,))]
    assert s.rank(1).node == "gpu-elsewhere"


def test_agent_killed_means_node_lost_then_restarted(fake_run):
    fake_run.start()
    fake_run.do_step()
    cfg = fast_config(agent_timeout_s=1.0, stall_floor_s=60)
    mon = Monitor(fake_run.dir, config=cfg)
    with mon:
        s = wait_state(
            mon,
            lambda s: s.nodes[0].sample is not None and s.nodes[0].state is NodeState.OK,
            10,
            "a first agent sample",
        )
        pid = s.nodes[0].sample.agent_pid
        assert psutil.Process(pid).cmdline()[1:3] == ["-m", "taehv_console.core.watch.agent"]
        os.kill(pid, signal.SIGKILL)
        t0 = time.time()
        s = wait_state(mon, lambda s: s.nodes[0].state is NodeState.LOST, 5, "node lost")
        assert time.time() - t0 < cfg.health.agent_timeout_s + 1.0
        assert "agent silent" in s.nodes[0].detail and s.nodes[0].agent.startswith("restarting")
        assert s.rank(0).state is RankState.HEALTHY  # the ranks' own health does not depend on the agent
        s = wait_state(mon, lambda s: s.nodes[0].state is NodeState.OK, 10, "agent restarted")
        assert s.nodes[0].sample.agent_pid != pid
        assert any("lost" in n.text for n in s.notices)
        new_pid = s.nodes[0].sample.agent_pid
    assert not psutil.pid_exists(new_pid) or psutil.Process(new_pid).status() == psutil.STATUS_ZOMBIE


def test_nodes_over_ssh_with_remote_agents_and_remote_files(sshd, tmp_path):
    from taehv_console.core.cluster.ssh import SshPool

    run = FakeRun(tmp_path / "run")
    hosts = [h.host for h in sshd.hosts[:2]]
    try:
        run.start()
        run.do_step()
        with SshPool(sshd.settings()) as pool:
            mon = Monitor(
                run.dir, hosts=hosts, pool=pool, remote_files=True, config=fast_config(stall_floor_s=60)
            )
            with mon:
                s = wait_state(
                    mon,
                    lambda s: all(n.sample is not None for n in s.nodes) and s.run.step == 1,
                    20,
                    "samples from both nodes and the events",
                )
                assert [n.name for n in s.nodes] == hosts and all(n.state is NodeState.OK for n in s.nodes)
                # both "nodes" are this machine (same hostname): ranks are placed node by node
                assert [(r.rank, r.node) for r in s.ranks] == [(0, hosts[0]), (1, hosts[1])]
                assert {src.name for src in s.sources} >= {f"agent@{hosts[0]}", f"events@{hosts[1]}"}
                assert all(n.clock_offset_s is not None and abs(n.clock_offset_s) < 1 for n in s.nodes)
                run.do_step()
                wait_state(mon, lambda s: len(s.history.loss.points) >= 2, 10, "step 2's event over SSH")
                # both nodes see the shared run directory: every line still counts once (after both
                # nodes' readers have had time to deliver it)
                time.sleep(1.0)
                s = mon.snapshot()
                assert [x for x, _ in s.history.loss.points] == [1.0, 2.0]
                assert sum(1 for n in s.notices if n.text.startswith("started")) == 1
                agent_pids = [n.sample.agent_pid for n in mon.snapshot().nodes]
            # the channel closed: the remote agents exit by themselves
            deadline = time.time() + 10
            while time.time() < deadline and any(psutil.pid_exists(p) for p in agent_pids):
                time.sleep(0.1)
            assert not any(psutil.pid_exists(p) for p in agent_pids)
    finally:
        run.close()


def test_an_unreachable_node_is_reported_on_its_source_and_lost(sshd, fake_run):
    from taehv_console.core.cluster.ssh import SshPool

    fake_run.start()
    cfg = fast_config(agent_timeout_s=1.0)
    with SshPool(sshd.settings(connect_timeout_s=2.0)) as pool:
        mon = Monitor(fake_run.dir, hosts=["127.0.0.99"], pool=pool, config=cfg)  # no sshd there
        with mon:
            s = wait_state(mon, lambda s: s.nodes[0].state is NodeState.LOST, 10, "node lost")
            src = next(x for x in s.sources if x.name == "agent@127.0.0.99")
            assert not src.ok and "127.0.0.99" in src.error
            assert s.node("127.0.0.99").agent.startswith("restarting")


def test_each_rank_shows_its_share_of_step_time_spent_waiting_for_data(fake_run):
    fake_run.start()
    fake_run.step += 1
    fake_run.beat(0, step_time_s=0.4, wait_s=0.0, data_wait_s=0.1)
    fake_run.beat(1, step_time_s=0.4, wait_s=0.0)  # a trainer from before the field: unknown, not 0
    s = snapshot_once(fake_run.dir, config=fast_config())
    assert s.rank(0).data_wait_share == pytest.approx(0.25)
    assert s.rank(1).data_wait_share is None
