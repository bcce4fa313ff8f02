"""What the monitor has read so far about one run, folded in as it arrives: trainer events,
heartbeats (one tracker per rank), agent samples (one per node), log signals, checkpoints,
state.json, run.toml and forensics reports. Mutable, guarded by the monitor's lock; view.py turns
it into an immutable RunView. Nothing here schedules or publishes.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from taehv_console.core.logscan import LogScanner
from taehv_console.core.run.records import DamagedRecord, damaged_line, parse_heartbeat
from taehv_console.core.run.state import RunState, StateError
from taehv_console.core.toml_compat import tomllib
from taehv_console.core.watch.events import EventFold, rank_of
from taehv_console.core.watch.health import RankObservation
from taehv_console.core.watch.nodeline import parse_sample
from taehv_console.core.watch.nodesample import NodeSample
from taehv_console.core.watch.state import (
    CheckpointSummary,
    ForensicsSummary,
    LogSignal,
    Notice,
    PointHistory,
    Series,
    copy_replacing,
)
from taehv_console.core.watch.tail import TailResult
from trainer.config import config_from_dict

_NODE_LOG = re.compile(r"node-(\d+)\.log$")
_HEARTBEAT = re.compile(r"rank-(\d+)\.json$")
# heartbeat keys that are not per-rank measurements
_HB_META = frozenset({"step", "time", "pid", "host", "stopped", "waiting_since", "waiting_op"})


class RankTracker:
    """One rank's heartbeats: its step, when it last advanced (console clock), recent step and
    own-work times, whether it is blocked in a collective, and its other numeric fields."""

    def __init__(self, rank: int, window: int):
        self.rank = rank
        self.pid: int | None = None
        self.host: str | None = None
        self.step: int | None = None
        self.hb_time: float | None = None
        self.progress_time: float | None = None
        self.waiting_since: float | None = None  # console clock; set while blocked in a collective
        self.stopped = False
        self.metrics: tuple[tuple[str, float], ...] = ()
        self.version = 0  # bumped on every heartbeat that changed something
        self.step_times: deque[float] = deque(maxlen=window)
        self.busy: deque[float] = deque(maxlen=window)
        self._recent: tuple[int, int, tuple] | None = None  # (version, window, recent()'s answer)

    def recent(self, window: int) -> tuple[tuple[float, ...], tuple[float, ...], float | None, float | None]:
        """(step times, own-work times, their medians over the last `window`), computed once per
        heartbeat: an agent sample makes every rank's observation new, not its steps."""
        hit = self._recent
        if hit is not None and hit[0] == self.version and hit[1] == window:
            return hit[2]
        steps, busy = tuple(self.step_times), tuple(self.busy)
        out = (
            steps,
            busy,
            statistics.median(steps[-window:]) if steps else None,
            statistics.median(busy[-window:]) if busy else None,
        )
        self._recent = (self.version, window, out)
        return out

    def update(self, hb: Mapping[str, Any], offset: float, now: float) -> bool:
        step, t, pid = hb.get("step"), hb.get("time"), hb.get("pid")
        if not isinstance(step, int) or not isinstance(t, (int, float)):
            return False
        pid = pid if isinstance(pid, int) else None
        if t == self.hb_time and pid == self.pid:
            return False
        new_attempt = pid != self.pid
        if new_attempt:  # a relaunch: its steps are not a continuation of the old process's
            self.step_times.clear()
            self.busy.clear()
        advanced = new_attempt or self.step is None or step != self.step
        st = hb.get("step_time_s")
        if advanced and isinstance(st, (int, float)) and st > 0:
            wait = hb.get("wait_s")
            self.step_times.append(float(st))
            self.busy.append(
                max(0.0, float(st) - float(wait)) if isinstance(wait, (int, float)) else float(st)
            )
        since = hb.get("waiting_since")
        self.waiting_since = min(float(since) - offset, now) if isinstance(since, (int, float)) else None
        if advanced:
            # The node's clock, corrected by its agent's offset, never later than now; a rank
            # blocked in a collective made no progress since it began to wait (a console that
            # starts mid-wait sees only the waiting heartbeat).
            self.progress_time = min(float(t) - offset, now)
            if self.waiting_since is not None:
                self.progress_time = min(self.progress_time, self.waiting_since)
        self.pid = pid
        if isinstance(hb.get("host"), str):
            self.host = hb["host"]
        self.step, self.hb_time = step, float(t)
        self.stopped = bool(hb.get("stopped"))
        # every other number the trainer puts in a heartbeat (wait_s, data_wait_s ...) travels as is
        self.metrics = tuple(
            sorted(
                (k, float(v))
                for k, v in hb.items()
                if k not in _HB_META
                and isinstance(v, (int, float))
                and not isinstance(v, bool)
                and math.isfinite(v)
            )
        )
        self.version += 1
        return True


class AgentState:
    """One node's agent: its stream (owned by its poller), newest sample, clock offset, GPU history."""

    def __init__(self, node: str, gpu_history_len: int, restart_s: float):
        self.node = node
        self.stream: Any = None
        self.sample: NodeSample | None = None
        self.opened_at: float | None = None  # console clock
        self.first_open: float | None = None
        self.last_line: float | None = None
        self.restart_at = 0.0
        self.restart_s = restart_s
        self.backoff = restart_s
        self.status = "starting"
        self.offsets: deque[float] = deque(maxlen=10)
        self.gpu_hist: dict[int, PointHistory] = {}
        self.gpu_series: dict[int, Series] = {}  # cached snapshot form, dropped when a point arrives
        self.gpu_history_len = gpu_history_len
        self.bad_lines = 0
        self.lock = threading.Lock()

    @property
    def offset(self) -> float:
        # sample.time - receipt time: transport delay only makes it smaller, so the largest is best
        return max(self.offsets) if self.offsets else 0.0


def run_config(text: str) -> dict[str, Any]:
    """run.toml with the trainer's defaults filled in (the collective timeout a run did not state is
    still the one it runs with); the raw table when it does not validate (another version's file)."""
    raw = tomllib.loads(text)
    try:
        return config_from_dict(raw, "run.toml").model_dump(mode="json")
    except Exception:  # noqa: BLE001 - any validation problem: fall back to what the file says
        return raw


def get(d: Mapping[str, Any], section: str, key: str) -> Any:
    sec = d.get(section) if isinstance(d, Mapping) else None
    return sec.get(key) if isinstance(sec, Mapping) else None


class Ingest:
    """Everything read so far. Every apply_* takes the lock; readers (view.py) hold it."""

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        local_mode: bool,
        rank_nodes: Mapping[int, str] | None,
        history_len: int,
        notices_len: int,
        signals_len: int,
        gpu_history_len: int,
        agent_restart_s: float,
        rank_window: int,
    ):
        self.hosts = list(hosts)
        self.local_mode = local_mode
        self.rank_nodes = dict(rank_nodes or {})
        self.lock = threading.RLock()
        self.fold = EventFold(history_len, notices_len)
        self.scanner = LogScanner()
        self.signals: deque[LogSignal] = deque(maxlen=signals_len)
        self.notices: deque[Notice] = deque(maxlen=notices_len)
        self.ranks: dict[int, RankTracker] = {}
        self.agents = {h: AgentState(h, gpu_history_len, agent_restart_s) for h in self.hosts}
        self.checkpoints = CheckpointSummary()
        self.run_cfg: dict[str, Any] = {}
        self.console: RunState | None = None
        self.console_raw: dict[str, Any] = {}
        self.forensics: dict[str, ForensicsSummary] = {}  # report file -> its summary
        self.damaged_files: dict[str, str] = {}  # file -> why it is skipped, while it stays damaged
        self._owner: dict[str, str] = {}  # file -> the reader (node) whose lines of it count
        self._rank_window = rank_window
        self._obs_cache: dict[int, tuple[tuple, RankObservation]] = {}  # rank -> (inputs, observation)
        self._obs_epoch: tuple = ()
        # rank -> (heartbeat version, its events' record, stop, error, observation, node sample)
        self._obs_same: dict[int, tuple] = {}
        self._ranks_sorted: list[int] = []
        self._sig_index: tuple[int, dict, dict] = (-1, {}, {})  # (signals_version, by rank, by pid)
        self.signals_version = 0  # bumped when a log signal arrives
        self.heartbeat_version = 0  # bumped when a heartbeat changed a rank
        self.version = 0  # bumped on every change: the publisher skips unchanged snapshots

    # ------------------------------------------------------------------ applying what was read
    def apply_agent_lines(self, a: AgentState, lines: list[str], now: float) -> None:
        samples = []
        for line in lines:
            if not line.startswith("{"):
                continue
            try:
                samples.append(parse_sample(line, received=now))
            except (
                ValueError,
                KeyError,
                TypeError,
                AttributeError,
                RecursionError,
            ):  # a line of another shape
                a.bad_lines += 1
        if not samples:
            return
        with self.lock:
            for s in samples:
                a.offsets.append(s.time - now)
                t = s.time - a.offset  # on the console's clock, like every other time in a snapshot
                for g in s.gpus:
                    if g.util_pct is not None:
                        h = a.gpu_hist.get(g.index)
                        if h is None:
                            h = a.gpu_hist[g.index] = PointHistory(a.gpu_history_len)
                        h.append((t, g.util_pct))
                        a.gpu_series.pop(g.index, None)
            a.sample = samples[-1]
            a.last_line = now
            a.status = "running"
            a.backoff = a.restart_s
            self.version += 1

    def _mine(self, path: str, reader: str) -> bool:
        """Whether lines of `path` read through `reader` count. With remote files on shared storage
        every node sees every file: the first node to deliver a file owns it, so nothing is counted
        twice; on per-node storage the paths are disjoint and each node owns its own."""
        return self._owner.setdefault(path, reader) == reader

    def apply_events(self, res: TailResult, now: float, reader: str = "") -> None:
        with self.lock:
            for path, data in res.whole.items():
                try:
                    if path == "run.toml":
                        self.run_cfg = run_config(data.decode())
                    elif path == "state.json":
                        self.console_raw = json.loads(data)
                        self.console = RunState.from_dict(self.console_raw)
                    elif path.startswith("forensics/"):
                        self.forensics[path] = ForensicsSummary.from_report(json.loads(data), path)
                        self._file_read(path)
                except (
                    ValueError,
                    UnicodeDecodeError,
                    StateError,
                    TypeError,
                    KeyError,
                    AttributeError,
                    RecursionError,
                ) as err:
                    # state.json and run.toml: being rewritten, or another version's (the next change
                    # reads them again; their readers say what is wrong); a report is written whole
                    if path.startswith("forensics/"):
                        why = (
                            "nested too deeply to read"
                            if isinstance(err, RecursionError)
                            else str(err).removeprefix(f"{path}: ")
                        )
                        self._file_damaged(path, f"not a forensics report ({why[:200]})", now, None)
            for path in res.reset:
                self.fold.restart(path)
            for path, lines in res.lines.items():
                r = rank_of(path)
                if r is not None and self._mine(path, reader):
                    self.fold.feed(r, lines, path)
            self.version += 1

    def _file_damaged(self, path: str, why: str, now: float, rank: int | None) -> None:
        """A whole file (a heartbeat, a forensics report) skipped as damaged: named once while it
        stays so, in `damaged_files` and as a warning notice."""
        if self.damaged_files.get(path) == why:
            return
        self.damaged_files[path] = why
        self.notices.append(Notice(now, "warning", "damaged", damaged_line(path, None, why), rank))
        self.version += 1

    def _file_read(self, path: str) -> None:
        if self.damaged_files.pop(path, None) is not None:
            self.version += 1

    def damaged(self) -> tuple[str, ...]:
        """Every damaged record skipped so far, named by file (and line): event lines, then files."""
        return tuple(self.fold.damaged) + tuple(
            damaged_line(p, None, w) for p, w in sorted(self.damaged_files.items())
        )

    def apply_heartbeats(self, res: TailResult, now: float, reader: str = "") -> None:
        with self.lock:
            place = self.placement()
            for path, data in res.whole.items():
                m = _HEARTBEAT.search(path)
                if not m:
                    continue
                r = int(m.group(1))
                try:
                    hb = parse_heartbeat(data)
                except DamagedRecord as err:
                    self._file_damaged(path, str(err), now, r)
                    continue
                self._file_read(path)
                t = self.ranks.get(r)
                if t is None:
                    t = self.ranks[r] = RankTracker(r, self._rank_window)
                a = self.agents.get(place(r, hb["host"] if isinstance(hb.get("host"), str) else None))
                offset = a.offset if a is not None else 0.0
                if t.update(hb, offset, now):
                    self.version += 1
                    self.heartbeat_version += 1

    def apply_logs(self, res: TailResult, now: float, reader: str = "") -> None:
        found: list[LogSignal] = []
        with self.lock:
            for path in res.reset:
                if self._mine(path, reader):
                    self.scanner.reset(path)
            for path, lines in res.lines.items():
                if self._mine(path, reader):
                    found += self.scanner.feed(path, [ln.decode(errors="replace") for ln in lines], now)
            for path in [p for p in self.scanner.pending() if p not in res.lines]:  # quiet logs: flush blocks
                if self._mine(path, reader):
                    found += self.scanner.flush(path, now)
            pid_rank = {t.pid: r for r, t in self.ranks.items() if t.pid is not None}
            for s in found:
                if s.rank is None and s.get("pid") in pid_rank:
                    s = replace(s, rank=pid_rank[s.get("pid")])
                self.signals.append(s)
                if s.severity in ("error", "warning"):
                    self.notices.append(
                        Notice(
                            now,
                            s.severity,
                            "log",
                            f"{Path(s.source).name}:{s.line}: {s.text}"[:300],
                            s.rank,
                            self.node_of_log(s.source),
                        )
                    )
            if found:
                self.version += 1
                self.signals_version += 1

    def set_checkpoints(self, summary: CheckpointSummary) -> None:
        with self.lock:
            if summary != self.checkpoints:
                self.checkpoints = summary
                self.version += 1

    # ------------------------------------------------------------------ what the facts add up to
    def world_size(self) -> int | None:
        started = [e.start.get("world_size") for e in self.fold.ranks.values() if e.start]
        sizes = [s for s in started if isinstance(s, int)]
        if sizes:
            return max(sizes)
        topo = self.run_cfg.get("topology") or {}
        if isinstance(topo.get("nodes"), int) and isinstance(topo.get("gpus_per_node"), int):
            return topo["nodes"] * topo["gpus_per_node"]
        return None

    def placement(self) -> Callable[[int, str | None], str]:
        """rank, heartbeat host -> node. Explicit rank_nodes first; then the one node whose name or
        agent-reported host name is the heartbeat's host; with several candidates (loopback "nodes"
        of one machine) ranks are placed node by node, as torchrun numbers them. Built once per
        snapshot: 512 ranks x 64 nodes compared one by one was most of a snapshot's cost."""
        by_host: dict[str, list[str]] = {}
        for n in self.hosts:
            names = {n}
            sample = self.agents[n].sample
            if sample is not None:
                names.add(sample.host)
            for name in names:
                by_host.setdefault(name, []).append(n)
        hosts, single = self.hosts, len(self.hosts) == 1
        world = None if single else self.world_size()
        per = max(1, math.ceil(world / len(hosts))) if world else 0
        rank_nodes, local_mode = self.rank_nodes, self.local_mode

        def place(rank: int, host: str | None) -> str:
            if rank in rank_nodes:
                return rank_nodes[rank]
            matches = by_host.get(host, ()) if host else ()
            if len(matches) == 1:
                return matches[0]
            if single:
                if not local_mode or not host or host == hosts[0]:
                    return hosts[0]
                return host  # local mode, a rank on another machine: a node without an agent
            if per:
                return hosts[min(rank // per, len(hosts) - 1)]
            return host or hosts[0]

        return place

    def node_of_log(self, path: str) -> str | None:
        m = _NODE_LOG.search(path)
        if m and int(m.group(1)) < len(self.hosts):
            return self.hosts[int(m.group(1))]
        return None

    def max_steps(self) -> int | None:
        for e in (self.fold.ranks.get(0), *self.fold.ranks.values()):
            if e is not None and e.start and isinstance(e.start.get("max_steps"), int):
                return e.start["max_steps"]
        return get(self.run_cfg, "optim", "max_steps")

    def current_step(self) -> int | None:
        steps = [t.step for t in self.ranks.values() if t.step is not None]
        last = self.fold.last_step.get("step") if self.fold.last_step else None
        cands = [s for s in [*steps, last] if isinstance(s, int)]
        return max(cands) if cands else None

    def pause_rule(self, pause_grace_s: float) -> Callable[[int | None], float]:
        """step -> extra seconds a heartbeat may pause at it: validation and checkpoint steps, the
        last step (final validation, save, export), any step while a save is in flight."""
        every, last_step, in_flight, grace = self._pause_inputs(pause_grace_s)

        def allowance(step: int | None) -> float:
            if step is None:
                return 0.0
            if in_flight or step == last_step or any(step % e == 0 for e in every):
                return grace
            return 0.0

        return allowance

    def _pause_inputs(self, pause_grace_s: float) -> tuple[tuple[int, ...], int | None, bool, float]:
        sched = self.run_cfg.get("schedule") or {}
        every = tuple(
            e for e in (sched.get("val_every"), sched.get("checkpoint_every")) if isinstance(e, int) and e > 0
        )
        in_flight = self.fold.checkpoint_in_flight() is not None
        return (
            every,
            self.max_steps(),
            in_flight,
            max(pause_grace_s, 2 * (self.fold.last_checkpoint_seconds() or 0.0)),
        )

    def observations(self, pause_grace_s: float, window: int = 8) -> list[RankObservation]:
        """One RankObservation per rank, rebuilt only for ranks whose inputs changed (its heartbeat,
        its node's agent sample, its events, signals, or its pause allowance)."""
        rank_signals, pid_signals = self._signal_index()
        obs = []
        # What every rank's observation depends on besides its own heartbeat, events and node sample
        # (placement, pause allowances, log signals): while it stands, a rank whose own inputs are the
        # very same objects as last time keeps its observation, at a few dict lookups per rank.
        epoch = (
            self._pause_inputs(pause_grace_s),
            self.world_size(),
            self.signals_version,
            tuple(a.sample.host if a.sample is not None else None for a in self.agents.values()),
        )
        if epoch != self._obs_epoch:
            self._obs_epoch = epoch
            self._obs_same.clear()
        same, agents = self._obs_same, self.agents
        if len(self._ranks_sorted) != len(self.ranks.keys() | self.fold.ranks.keys()):
            self._ranks_sorted = sorted(self.ranks.keys() | self.fold.ranks.keys())
        pause = self.pause_rule(pause_grace_s)
        place = self.placement()
        for r in self._ranks_sorted:
            t = self.ranks.get(r)
            ev = self.fold.ranks.get(r)
            kept = same.get(r)
            if (
                kept is not None
                and t is not None
                and kept[0] == t.version
                and kept[1] is ev
                and (ev is None or (kept[2] is ev.stop and kept[3] is ev.error))
            ):
                o = kept[4]
                a = agents.get(o.node)
                sample = a.sample if a is not None else None
                if sample is not kept[5]:  # only its node's agent sampled again: swap the process view in
                    if sample is not None and o.pid is not None:
                        o = copy_replacing(o, process=sample.process(o.pid), process_time=sample.received)
                    else:
                        o = copy_replacing(o, process=None, process_time=None)
                    self._obs_cache[r] = (self._obs_cache[r][0], o)
                    same[r] = (*kept[:4], o, sample)
                obs.append(o)
                continue
            node = place(r, t.host if t else (ev.start.get("node") if ev and ev.start else None))
            a = self.agents.get(node)
            proc = ptime = None
            if a is not None and a.sample is not None and t is not None and t.pid is not None:
                proc = a.sample.process(t.pid)
                ptime = a.sample.received
            finished = None
            if ev is not None and ev.stop is not None:
                finished = str(ev.stop.get("reason") or "done")
            elif t is not None and t.stopped:
                finished = "done"
            sigs = rank_signals.get(r, ())
            if t is not None and t.pid is not None and t.pid in pid_signals:
                sigs = [*sigs, *(s for s in pid_signals[t.pid] if s not in sigs)]
            if t is None:
                obs.append(
                    RankObservation(
                        rank=r,
                        node=node,
                        finished=finished,
                        error=ev.error if ev else None,
                        signals=tuple(sigs),
                    )
                )
                continue
            allowance = pause(t.step)
            key = (t.version, node, finished, ev.error if ev else None, len(sigs), allowance)
            hit = self._obs_cache.get(r)
            if hit is not None and hit[0] == key:
                o = hit[1]
                if o.process is not proc or o.process_time != ptime:
                    # only the node's agent sampled again (every second on every node): the same
                    # observation with the new process view, without building the rest anew
                    o = copy_replacing(o, process=proc, process_time=ptime)
                    self._obs_cache[r] = (key, o)
                same[r] = (
                    t.version,
                    ev,
                    ev.stop if ev else None,
                    ev.error if ev else None,
                    o,
                    a.sample if a else None,
                )
                obs.append(o)
                continue
            steps, busy, step_median, busy_median = t.recent(window)
            o = RankObservation(
                rank=r,
                node=node,
                step=t.step,
                progress_time=t.progress_time,
                step_times=steps,
                busy=busy,
                pid=t.pid,
                finished=finished,
                error=ev.error if ev else None,
                process=proc,
                process_time=ptime,
                pause_allowance_s=allowance,
                signals=tuple(sigs),
                waiting_since=t.waiting_since,
                metrics=t.metrics,
                step_median=step_median,
                busy_median=busy_median,
            )
            self._obs_cache[r] = (key, o)
            same[r] = (
                t.version,
                ev,
                ev.stop if ev else None,
                ev.error if ev else None,
                o,
                a.sample if a else None,
            )
            obs.append(o)
        return obs

    def _signal_index(self) -> tuple[dict[int, list[LogSignal]], dict[int, list[LogSignal]]]:
        """Error signals by rank and by pid, rebuilt only when a signal arrived."""
        if self._sig_index[0] != self.signals_version:
            by_rank: dict[int, list[LogSignal]] = {}
            by_pid: dict[int, list[LogSignal]] = {}
            for s in self.signals:
                if s.severity != "error":
                    continue
                if s.rank is not None:
                    by_rank.setdefault(s.rank, []).append(s)
                if s.get("pid") is not None:
                    by_pid.setdefault(int(s.get("pid")), []).append(s)
            self._sig_index = (self.signals_version, by_rank, by_pid)
        return self._sig_index[1], self._sig_index[2]
