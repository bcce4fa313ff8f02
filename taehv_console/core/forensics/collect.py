"""StallForensics: once per confirmed stall, gather what can be known about it and return one
ForensicsReport. py-spy stacks of the stalled rank and a healthy peer (on their nodes; where py-spy
is missing or not permitted, the ranks' own faulthandler dumps, which need no ptrace), Flight
Recorder dumps and PyTorch's analysis (NCCL runs), NCCL RAS's verdict (NCCL runs, safe versions,
after communicator init, at most every 15 s per node). Whatever cannot be done becomes a note,
one per node and cause; nothing here raises to the caller.

Blocking: call it from a worker thread. py-spy comes first and is handed to `on_partial` at once,
because Flight Recorder waits several seconds for ranks to write their dumps.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from taehv_console.core.cluster.ssh import NodeRunner, SshError, SshPool, fan_out
from taehv_console.core.forensics import flight_recorder as fr
from taehv_console.core.forensics import pyspy, ras, selfdump
from taehv_console.core.forensics.node import UNREACHABLE, node_command
from taehv_console.core.forensics.report import ForensicsReport, RankRef, StackDump
from taehv_console.core.plan import flight_recorder as fr_launch
from taehv_console.core.run.records import DamagedRecord, parse_heartbeat
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.run.state import RunState, StateError
from trainer.config import TrainConfig
from trainer.events import STACK_SIGNAL, atomic_write_text, stacks_path

FORENSICS_DIR = "forensics"
PYSPY_FIX = {
    pyspy.MISSING: "install py-spy beside the node's python (pip install py-spy)",
    pyspy.DENIED: "needs SYS_PTRACE: docker run --cap-add SYS_PTRACE, or Kubernetes "
    "securityContext.capabilities.add: [SYS_PTRACE]",
}


def _stamp(t: float) -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f"{int(t * 1000) % 1000:03d}Z"


class StallForensics:
    """Forensics for one run. `pool` gives a NodeRunner per host (SshPool: LocalRunner for this
    machine, SSH otherwise). Nodes are found through state.json's hosts (what the console launched
    on), falling back to the host a rank's heartbeat names."""

    def __init__(
        self,
        run_dir: Path,
        pool: SshPool,
        *,
        analyser_python: str = sys.executable,
        pyspy_timeout: float = pyspy.DUMP_TIMEOUT_S,
        fr_wait: float = fr.DUMP_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.run = RunDir(Path(run_dir))
        self.pool = pool
        self.analyser_python = analyser_python
        self.pyspy_timeout = pyspy_timeout
        self.fr_wait = fr_wait
        self._clock = clock
        self._lock = threading.Lock()
        self._pyspy_unusable: dict[str, str] = {}  # host -> the note saying why (not asked again)
        self._ras_last: dict[str, tuple[float, str | None, str]] = {}  # host -> (when, verdict, note)

    @property
    def dir(self) -> Path:
        return self.run.path / FORENSICS_DIR

    # ------------------------------------------------------------------------------ nodes
    def _state(self) -> RunState | None:
        """state.json, or None: a missing or damaged one must not stop forensics (the heartbeat's
        host and the config's environment will do)."""
        try:
            return self.run.read_state() if self.run.has_state() else None
        except (StateError, OSError, ValueError, TypeError, KeyError):
            return None

    def _host(self, ref: RankRef) -> str:
        state = self._state()
        hosts = state.hosts if state else ()
        if 0 <= ref.node < len(hosts) and hosts[ref.node]:
            return hosts[ref.node]
        if not ref.host or ref.host in (socket.gethostname(), socket.getfqdn()):
            return "localhost"
        return ref.host

    def _ref_for_rank(self, rank: int, node: int) -> RankRef:
        """A rank as its heartbeat names it (host, pid); host '' when it has none yet."""
        beat = self._heartbeat(rank)
        if beat is None:
            return RankRef(rank=rank, node=node, host="", pid=0)
        return RankRef(rank=rank, node=node, host=beat.get("host") or "", pid=beat.get("pid") or 0)

    def _heartbeat(self, rank: int) -> dict[str, Any] | None:
        """The rank's heartbeat, checked (records.parse_heartbeat); None when it is not there yet or
        damaged (a damaged one names no process to look at)."""
        try:
            return parse_heartbeat((self.run.heartbeats / f"rank-{rank}.json").read_bytes())
        except (OSError, DamagedRecord):
            return None

    def _runner(self, host: str) -> NodeRunner:
        return self.pool.runner(host)

    def _config(self) -> tuple[TrainConfig | None, str]:
        try:
            return self.run.load_config(), ""
        except (OSError, ValueError) as err:  # a note: the stacks are still worth having
            return None, f"cannot read {self.run.run_toml}: {err}"

    # ------------------------------------------------------------------------------ py-spy
    def _dump_one(self, ref: RankRef, role: str, host: str) -> tuple[StackDump | None, list[str]]:
        """py-spy on the rank; where py-spy is missing, not permitted or fails, the rank's own
        faulthandler dump (selfdump). The notes say what stood in the way and which one it was."""
        try:
            runner = self._runner(host)
        except (SshError, OSError, ValueError) as err:
            return None, [f"node {ref.node} ({host}) unreachable for py-spy: {err}"]
        with self._lock:
            known = self._pyspy_unusable.get(host)
        if known:
            return self._selfdump(runner, ref, role, host, known)
        reply = node_command(
            runner,
            ["pyspy", "--pid", str(ref.pid), "--timeout", str(self.pyspy_timeout)],
            timeout=self.pyspy_timeout + 30,
        )
        kind, error = reply.get("kind", pyspy.FAILED), reply.get("error", "")
        if kind == UNREACHABLE:
            return None, [f"node {ref.node} ({host}) unreachable for py-spy: {error}"]
        if kind in PYSPY_FIX:
            what = "not installed" if kind == pyspy.MISSING else "not permitted"
            fix = PYSPY_FIX[kind]
            scope = reply.get("ptrace_scope", "")
            if kind == pyspy.DENIED and scope not in ("", "0"):
                fix += f"; kernel.yama.ptrace_scope={scope} also forbids it for non-root (set it to 0)"
            note = f"py-spy {what} on node {ref.node} ({host}): {fix} [{error}]"
            with self._lock:
                self._pyspy_unusable[host] = note
            return self._selfdump(runner, ref, role, host, note)
        if kind == pyspy.GONE:
            return None, [f"rank {ref.rank}: process {ref.pid} is gone from node {ref.node} ({host})"]
        if kind != pyspy.OK:
            note = f"py-spy failed on rank {ref.rank} (node {ref.node}, {host}): {error}"
            return self._selfdump(runner, ref, role, host, note)
        text = reply.get("text", "")
        try:
            parsed = pyspy.parse_dump(text)
        except ValueError as err:
            note = f"py-spy output for rank {ref.rank} unreadable: {err}"
            return self._selfdump(runner, ref, role, host, note)
        source = "py-spy dump" + (" (--nonblocking)" if reply.get("nonblocking") else "")
        return self._keep(ref, role, host, "pyspy", source, text, parsed, reply.get("state", "")), []

    def _selfdump(
        self, runner: NodeRunner, ref: RankRef, role: str, host: str, why: str
    ) -> tuple[StackDump | None, list[str]]:
        """The rank's own stack dump (trainer.events.install_stack_dump), after py-spy could not."""
        args = ["selfdump", "--pid", str(ref.pid), "--file", str(stacks_path(self.run.path, ref.rank))]
        reply = node_command(runner, args, timeout=selfdump.DUMP_TIMEOUT_S + 30)
        if reply.get("kind") != selfdump.OK:
            return None, [why, f"rank {ref.rank}'s own stack dump: {reply.get('error') or reply.get('kind')}"]
        text = reply.get("text", "")
        try:
            parsed = selfdump.parse_faulthandler(text, ref.pid, int(reply.get("main", 0)))
        except ValueError as err:
            return None, [why, f"rank {ref.rank}'s own stack dump unreadable: {err}"]
        source = f"the rank's own dump (faulthandler on {STACK_SIGNAL.name})"
        dump = self._keep(ref, role, host, "stack", source, text, parsed, reply.get("state", ""))
        return dump, [why, f"rank {ref.rank}'s stack is {source}, not py-spy's"]

    def _keep(
        self,
        ref: RankRef,
        role: str,
        host: str,
        prefix: str,
        source: str,
        text: str,
        parsed: pyspy.PyspyDump,
        state: str,
    ) -> StackDump:
        """Write the whole dump into the run's forensics folder and return its StackDump."""
        now = time.time()
        main = parsed.main_thread()
        path = self.dir / f"{prefix}-rank{ref.rank}-{role}-{_stamp(now)}.txt"
        header = (
            f"# {source} of rank {ref.rank} ({role}), pid {ref.pid} on node {ref.node} ({host}), "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(now))}, process state {state or '?'}\n"
        )
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, header + text)
        return StackDump(
            rank=ref.rank,
            role=role,
            frames=main.frames if main else (),
            path=str(path),
            host=host,
            pid=ref.pid,
            time=now,
            process_state=state,
            threads=len(parsed.threads),
        )

    def stacks(self, stalled: RankRef, peer: RankRef | None) -> tuple[tuple[StackDump, ...], tuple[str, ...]]:
        """The stacks of the stalled rank and the peer, at once, each on its node: py-spy's, else
        the rank's own dump."""
        jobs = {"stalled": stalled} | ({"peer": peer} if peer is not None else {})
        hosts = {role: self._host(ref) for role, ref in jobs.items()}
        results = fan_out(list(jobs), lambda role: self._dump_one(jobs[role], role, hosts[role]), 2)
        dumps, notes = [], []
        for role, res in results.items():
            if isinstance(res, Exception):
                notes.append(f"py-spy on rank {jobs[role].rank}: {type(res).__name__}: {res}")
                continue
            dump, said = res
            if dump is not None:
                dumps.append(dump)
            notes += said
        return tuple(dumps), tuple(dict.fromkeys(notes))

    # ------------------------------------------------------------------------ Flight Recorder
    def _fr_settings(self, cfg: TrainConfig) -> tuple[fr_launch.FlightRecorderPaths, int]:
        # what the ranks were launched with: the config's nccl_env, then the run's --env
        env = dict(cfg.distributed.nccl_env)
        state = self._state()
        env.update(dict(state.env) if state else {})
        paths = fr_launch.paths_for(self.run.path)
        paths = fr_launch.FlightRecorderPaths(
            trace_stem=env.get(fr_launch.ENV_TEMP_FILE, paths.trace_stem),
            pipe_stem=env.get(fr_launch.ENV_PIPE_FILE, paths.pipe_stem),
            copies=paths.copies,
        )
        try:
            size = int(env.get(fr_launch.ENV_BUFFER, fr_launch.TRACE_BUFFER_SIZE))
        except ValueError:
            size = 0
        return paths, size

    def flight_recorder(
        self, cfg: TrainConfig, stalled: RankRef, when: float
    ) -> tuple[tuple[str, ...], tuple[str, ...], str]:
        """Trigger every rank's dump on its node, copy them, analyse. (verdict, notes, folder)."""
        paths, size = self._fr_settings(cfg)
        if size <= 0:
            return (), (f"Flight Recorder is off: {fr_launch.ENV_BUFFER} is 0 in the run's nccl_env",), ""
        t = cfg.topology
        dest = Path(paths.copies) / f"{_stamp(when)}-rank{stalled.rank}"
        by_node = fr.ranks_by_node(range(t.world_size), t.gpus_per_node)
        ref_by_node = {stalled.node: stalled}

        def one(node_key: str) -> dict:
            node = int(node_key)
            ref = ref_by_node.get(node) or self._ref_for_rank(by_node[node][0], node)
            host = self._host(ref)
            args = [
                "fr-dump",
                "--pipe-stem",
                paths.pipe_stem,
                "--trace-stem",
                paths.trace_stem,
                "--dest",
                str(dest),
                "--timeout",
                str(self.fr_wait),
            ]
            for r in by_node[node]:
                args += ["--rank", str(r)]
            try:
                runner = self._runner(host)
            except (SshError, OSError, ValueError) as err:
                return {"kind": UNREACHABLE, "error": str(err), "host": host}
            reply = node_command(runner, args, timeout=self.fr_wait + 60)
            reply["host"] = host
            return reply

        replies = fan_out([str(n) for n in by_node], one, 16)
        notes: list[str] = []
        copied = 0
        no_dump: list[int] = []
        for node_key, reply in replies.items():
            if isinstance(reply, Exception):
                notes.append(f"Flight Recorder on node {node_key}: {type(reply).__name__}: {reply}")
                continue
            if reply.get("kind") == UNREACHABLE:
                notes.append(
                    f"Flight Recorder: node {node_key} ({reply.get('host')}) unreachable: {reply.get('error')}"
                )
                continue
            copied += len(reply.get("copied", {}))
            no_dump += [int(r) for r in reply.get("missing", {})]
            whys = dict.fromkeys(reply.get("missing", {}).values())
            for why in whys:
                ranks = sorted(int(r) for r, w in reply.get("missing", {}).items() if w == why)
                notes.append(f"Flight Recorder: ranks {ranks} on node {node_key}: {why}")
        if not copied:
            return (), tuple(notes) or ("Flight Recorder: no rank wrote a dump",), ""
        verdict, text = fr.analyse(dest, python=self.analyser_python, incomplete=bool(no_dump))
        if no_dump:
            # the analyser cannot name a rank that wrote nothing; that is itself the finding
            head = "no Flight Recorder dump from ranks"
            verdict = (f"{head} {set(no_dump)}",) + tuple(v for v in verdict if not v.startswith(head))
        atomic_write_text(dest / "analysis.txt", text)
        return verdict, tuple(notes), str(dest)

    # ---------------------------------------------------------------------------------- RAS
    def _communicators_ready(self, ref: RankRef | None) -> bool:
        """A rank that finished a step has its communicators initialised (RAS queries during init
        have crashed jobs)."""
        if ref is None:
            return False
        beat = self._heartbeat(ref.rank)
        return beat is not None and beat["step"] >= 1

    def nccl_ras(self, ask: RankRef, ready: bool) -> tuple[str | None, str, str]:
        """(verdict line or None, note, raw text), asking at most every 15 s per node."""
        if not ready:
            return None, "NCCL RAS not asked: no rank has finished a step yet (communicator init)", ""
        host = self._host(ask)
        now = self._clock()
        with self._lock:
            last = self._ras_last.get(host)
            if last and now - last[0] < ras.RAS_MIN_INTERVAL_S:
                return last[1], last[2], ""
            self._ras_last[host] = (now, None, "NCCL RAS: a query is already under way")
        try:
            runner = self._runner(host)
        except (SshError, OSError, ValueError) as err:
            reply = {"kind": UNREACHABLE, "error": str(err)}
        else:
            reply = node_command(runner, ["ras", "--pid", str(ask.pid)], timeout=ras.QUERY_TIMEOUT_S + 30)
        verdict, note, text = None, "", reply.get("text", "")
        kind = reply.get("kind")
        if kind == "ok":
            try:
                verdict = ras.parse_status(text).line()
            except ValueError as err:
                note = f"NCCL RAS on node {ask.node}: {err}"
        elif kind == "refused":
            note = f"NCCL RAS not asked on node {ask.node}: {reply.get('error')}"
        else:
            note = f"NCCL RAS unavailable on node {ask.node}: {reply.get('error')}"
        with self._lock:
            self._ras_last[host] = (self._clock(), verdict, note)
        return verdict, note, text

    # ------------------------------------------------------------------------------ collect
    def collect(
        self,
        stalled: RankRef,
        peer: RankRef | None,
        *,
        on_partial: Callable[[ForensicsReport], None] | None = None,
        communicators_ready: bool | None = None,
    ) -> ForensicsReport:
        """Everything about one confirmed stall. Never raises for a node or tool problem: each
        becomes a note. The caller keeps the report (the run's pipeline writes it under
        RUN/forensics/, beside the dumps; ForensicsReport.from_json reads it back)."""
        started = time.time()
        dumps, notes = self.stacks(stalled, peer)
        cfg, cfg_note = self._config()
        all_notes = list(notes) + ([cfg_note] if cfg_note else [])
        report = ForensicsReport(
            stalled_rank=stalled.rank,
            dumps=dumps,
            notes=tuple(all_notes),
            flight_recorder=(),
            ras=None,
            time=started,
        )
        if cfg is None:
            return report
        if cfg.topology.device != "cuda":
            all_notes += [
                "Flight Recorder unavailable: it records NCCL collectives; this run uses gloo (CPU)",
                "NCCL RAS unavailable: this run uses gloo (CPU), not NCCL",
            ]
            return replace(report, notes=tuple(all_notes))
        if on_partial is not None:
            on_partial(report)
        verdict, fr_notes, fr_dir = self.flight_recorder(cfg, stalled, started)
        ready = self._communicators_ready(peer) if communicators_ready is None else communicators_ready
        ras_verdict, ras_note, ras_text = self.nccl_ras(peer or stalled, ready)
        all_notes += list(fr_notes) + ([ras_note] if ras_note else [])
        return replace(
            report,
            notes=tuple(dict.fromkeys(all_notes)),
            flight_recorder=verdict,
            ras=ras_verdict,
            fr_dir=fr_dir,
            ras_text=ras_text,
        )
