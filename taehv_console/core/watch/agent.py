"""Per-node agent: prints one JSON object per interval with what changes on the node (per-GPU
utilisation, memory, temperature, power, the run's processes; CPU, RAM, disk, network). The
console turns such a line into a NodeSample (core/watch/nodeline.py).

    python -m taehv_console.core.watch.agent [--interval 1] [--run RUN_DIR] [--disk PATH]...

It exits when its stdin closes (the console holds the other end of the pipe or SSH channel), so it
never outlives the console. No GPU or no NVML gives a CPU-only sample with gpu.ok = false. It never
imports torch: it runs on every node every second.

The GPU part of a line is the raw NVML reading (`read` of core/watch/nvml.py's NvmlSampler); all
decisions are made on the console from it (`nodeline.gpu_samples`), so they are tested on recorded
readings.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from taehv_console.core.watch.kmsg import KMSG, XidReader
from taehv_console.core.watch.nvml import MB, NvmlSampler

AGENT_VERSION = 1
# ------------------------------------------------------------------------------- host and processes


class RunProcesses:
    """pid -> rank of this run's processes on this node, from the heartbeat files (host == ours).

    The file names do not say the host, so finding this node's ranks from the files means reading
    every heartbeat, on shared storage: 256 agents reading 2,048 files every 10 s would be 52,000
    reads a second. So the node's ranks come first from its process table: the run's workers
    (`trainer.cli --run RUN`) carry RANK, LOCAL_RANK and LOCAL_WORLD_SIZE in their environments
    (torchrun sets them), and once all LOCAL_WORLD_SIZE of them are there, only their files are
    read, from start-up on (a file not written yet, or left by an earlier placement, gives no pid
    while the table still says the rank is here; when a worker is gone, the table is looked at
    again for relaunched workers holding other ranks). Where the table does not say (workers not
    started yet, another launcher), every file is read until as many ranks as a found rank's
    LOCAL_WORLD_SIZE are found (without it, every read stays a full one), and a file of those
    that is missing or names another host (the rank moved) starts the search again. Reads come
    every `refresh_s` while the pids are known, every `search_s` while none is, and at once when a
    known pid is gone (a relaunch writes new pids)."""

    def __init__(self, run_dir: str | None, hostname: str, refresh_s: float = 10.0, search_s: float = 2.0):
        self.dir = Path(run_dir) / "heartbeat" if run_dir else None
        self.hostname = hostname
        self.refresh_s = refresh_s
        self.search_s = search_s
        self._pids: dict[int, int] = {}
        self._own: tuple[int, ...] = ()  # this node's ranks, once all are known
        self._by_table = False  # whether the process table said them (not the files)
        self._table_at = -1e18
        self._table_ranks: tuple[int, ...] = ()
        self._read_at = -1e18

    def current(self, now: float, gone: bool = False) -> dict[int, int]:
        every = self.refresh_s if self._pids else self.search_s
        if self.dir is not None and (gone or now - self._read_at >= every):
            self._read_at = now
            pids = self._own_pids(now, gone) if self._own else None
            self._pids = self._search(now) if pids is None else pids
        return self._pids

    def _own_pids(self, now: float, gone: bool) -> dict[int, int] | None:
        """pid -> rank from this node's own files; None when its ranks must be found again."""
        # a worker is gone: relaunched workers may hold other ranks while the old files still name
        # this host (at most every refresh_s; a failed run's dead pids that nothing replaces leave
        # the table empty and bring no full reads)
        recheck = gone and self._by_table and now - self._table_at >= self.refresh_s
        if recheck and self._table(now) not in ((), self._own):
            return None
        pids, elsewhere = self._read(self._files(self._own))
        # not written yet, stale from an earlier placement, or the ranks moved: keep them only
        # while this node's process table still says they are ours
        if (elsewhere or len(pids) < len(self._own)) and self._table(now) != self._own:
            return None
        return pids

    def _search(self, now: float) -> dict[int, int]:
        """This node's ranks from the process table, else from every file (see the class doc)."""
        self._own = self._table(now)
        self._by_table = bool(self._own)
        if self._own:
            return self._read(self._files(self._own))[0]
        try:
            paths = [Path(e.path) for e in os.scandir(self.dir)]
        except OSError:
            paths = []
        pids, _ = self._read(paths)
        if pids and _local_world_size(pids) == len(pids):
            self._own = tuple(sorted(pids.values()))
        return pids

    def _table(self, now: float) -> tuple[int, ...]:
        """_workers_ranks, looked at once per read (`now`)."""
        assert self.dir is not None  # current() reads only with a run directory
        if self._table_at != now:
            self._table_at, self._table_ranks = now, _workers_ranks(self.dir.parent)
        return self._table_ranks

    def _files(self, ranks: tuple[int, ...]) -> list[Path]:
        assert self.dir is not None  # current() reads only with a run directory
        return [self.dir / f"rank-{r}.json" for r in ranks]

    def _read(self, paths: list[Path]) -> tuple[dict[int, int], bool]:
        """(pid -> rank of the files naming this host, whether any file names another host)."""
        pids: dict[int, int] = {}
        elsewhere = False
        for path in paths:
            name = path.name
            if not (name.startswith("rank-") and name.endswith(".json")):
                continue
            try:
                beat = json.loads(path.read_text())
                rank = int(name[5:-5])
            except (OSError, ValueError, RecursionError):  # ValueError: not JSON, not UTF-8
                continue  # not written yet, or being replaced right now; the next read has it
            if not isinstance(beat, dict):
                continue  # damaged (the console names it: records.parse_heartbeat); it names no process
            if beat.get("host") != self.hostname:
                elsewhere = True
            elif isinstance(beat.get("pid"), int):
                pids[beat["pid"]] = rank
        return pids, elsewhere


def _workers_ranks(run_dir: Path) -> tuple[int, ...]:
    """This node's ranks of the run, from the process table alone (no shared-storage reads): the
    processes running `trainer.cli --run RUN_DIR` with RANK, LOCAL_RANK and LOCAL_WORLD_SIZE in
    their environments. () unless all LOCAL_WORLD_SIZE of them are found (the launcher itself has
    no LOCAL_RANK; a stray RANK in a platform's pod environment makes the count disagree)."""
    want = os.path.realpath(run_dir)
    ranks: set[int] = set()
    sizes: set[int] = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "trainer.cli" not in cmd or "--run" not in cmd[:-1]:
            continue
        try:
            where = os.path.join(proc.cwd(), cmd[cmd.index("--run") + 1])
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        found = [env.get(k, "") for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")]
        if os.path.realpath(where) == want and all(v.isdigit() for v in found):
            ranks.add(int(found[0]))
            sizes.add(int(found[2]))
    return tuple(sorted(ranks)) if len(sizes) == 1 and len(ranks) == sizes.pop() else ()


def _local_world_size(pids: Mapping[int, int]) -> int | None:
    """How many ranks this node runs, from LOCAL_WORLD_SIZE in one of their environments (set by
    torchrun for each worker); None when no environment says."""
    for pid in pids:
        try:
            value = psutil.Process(pid).environ().get("LOCAL_WORLD_SIZE")
        except (psutil.Error, OSError):
            continue
        if value and value.isdigit():
            return int(value)
    return None


class HostSampler:
    """psutil readings; CPU percentages are since the previous call, so the first one is primed."""

    def __init__(self, disks: list[str]):
        self.psutil = psutil
        self.disks = disks
        psutil.cpu_percent(None)
        self._net = psutil.net_io_counters()
        self._net_t = time.monotonic()
        self._procs: dict[int, Any] = {}

    def read(self) -> dict[str, Any]:
        ps = self.psutil
        mem = ps.virtual_memory()
        out: dict[str, Any] = {
            "cpu_pct": ps.cpu_percent(None),
            "cpu_count": ps.cpu_count() or 0,
            "load1": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "ram_used_gb": round((mem.total - mem.available) / 2**30, 3),
            "ram_total_gb": round(mem.total / 2**30, 3),
            "disks": [],
        }
        for path in self.disks:
            try:
                du = ps.disk_usage(path)
            except OSError:
                continue
            out["disks"].append(
                {
                    "path": path,
                    "used_gb": round(du.used / 2**30, 3),
                    "total_gb": round(du.total / 2**30, 3),
                    "free_gb": round(du.free / 2**30, 3),
                }
            )
        net, t = ps.net_io_counters(), time.monotonic()
        dt = max(t - self._net_t, 1e-6)
        out["net_rx_mbps"] = round((net.bytes_recv - self._net.bytes_recv) * 8 / dt / 1e6, 3)
        out["net_tx_mbps"] = round((net.bytes_sent - self._net.bytes_sent) * 8 / dt / 1e6, 3)
        self._net, self._net_t = net, t
        return out

    def processes(self, pids: Mapping[int, int]) -> tuple[list[dict[str, Any]], dict[int, int], bool]:
        """(per-process dicts, pid -> rank including children (GPU memory is held by the rank or
        its workers), whether a known pid is gone)."""
        ps = self.psutil
        rows, owners, gone = [], {}, False
        for pid in list(self._procs):
            if pid not in pids:
                del self._procs[pid]
        for pid, rank in sorted(pids.items()):
            row: dict[str, Any] = {"pid": pid, "rank": rank, "status": "gone"}
            try:
                proc = self._procs.get(pid)
                if proc is None:
                    proc = self._procs[pid] = ps.Process(pid)
                    proc.cpu_percent(None)  # prime; the next sample has a real value
                    cpu = None
                else:
                    cpu = proc.cpu_percent(None)
                with proc.oneshot():
                    row["status"] = proc.status()
                    row["rss_mb"] = round(proc.memory_info().rss / MB, 1)
                row["cpu_pct"] = cpu
                owners[pid] = rank
                for child in proc.children(recursive=True):
                    owners[child.pid] = rank
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess) as err:
                self._procs.pop(pid, None)
                row["status"] = "zombie" if isinstance(err, ps.ZombieProcess) else "gone"
                gone = True
            rows.append(row)
        return rows, owners, gone


# ------------------------------------------------------------------------------------------ sample


class Agent:
    def __init__(
        self,
        *,
        run_dir: str | None,
        disks: list[str],
        interval: float,
        hostname: str | None = None,
        nvml: Any = None,
        replay: list[dict] | None = None,
        use_nvml: bool = True,
        kmsg: str | None = KMSG,
    ):
        self.hostname = hostname or socket.gethostname()
        self.interval = interval
        self.replay = replay
        self.nvml = None if (replay is not None or not use_nvml) else NvmlSampler(nvml)
        self.host = HostSampler(disks)
        self.procs = RunProcesses(run_dir, self.hostname)
        # Xid lines in the kernel log (hardware evidence); none for a replayed or synthetic node
        self.xids = XidReader(kmsg) if (kmsg and replay is None) else None
        self.seq = 0
        self._gone = False

    def sample(self) -> dict[str, Any]:
        now = time.time()
        if self.replay is not None:
            gpu = self.replay[self.seq % len(self.replay)]
        elif self.nvml is not None:
            gpu = self.nvml.read()
        else:
            gpu = {"ok": False, "reason": "NVML disabled (--no-nvml)", "devices": []}
        pids = self.procs.current(time.monotonic(), gone=self._gone)
        rows, owners, self._gone = self.host.processes(pids)
        line = {
            "v": AGENT_VERSION,
            "host": self.hostname,
            "time": now,
            "seq": self.seq,
            "interval_s": self.interval,
            "agent_pid": os.getpid(),
            "nvml": gpu,
            **self.host.read(),
            "processes": rows,
            "owners": {str(k): v for k, v in owners.items()},
            "xid": (
                self.xids.sample()
                if self.xids is not None
                else {"ok": False, "reason": "kernel log not read", "events": []}
            ),
        }
        self.seq += 1
        return line

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
        if self.xids is not None:
            self.xids.close()


def _stdin_closed(fd: int, timeout: float) -> bool:
    """Wait up to `timeout` for stdin; True once it reached EOF (the console went away)."""
    try:
        ready, _, _ = select.select([fd], [], [], max(timeout, 0.0))
    except (OSError, ValueError):
        return True
    if not ready:
        return False
    try:
        return os.read(fd, 65536) == b""
    except OSError:
        return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m taehv_console.core.watch.agent",
        description="Print one JSON sample of this node per interval until stdin closes.",
    )
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--run", help="run directory: its heartbeats name this node's training processes")
    ap.add_argument("--disk", action="append", default=[], help="path whose filesystem usage to report")
    ap.add_argument(
        "--count", type=int, default=0, help="stop after this many samples (0 = until stdin closes)"
    )
    ap.add_argument("--no-nvml", action="store_true", help="report no GPUs (a CPU-only sample)")
    ap.add_argument(
        "--kmsg", default=KMSG, help="kernel log to read Xid lines from ('' for none; default %(default)s)"
    )
    ap.add_argument(
        "--replay", help="JSON file of recorded NVML readings to report instead of NVML (demos, benchmarks)"
    )
    ap.add_argument("--host-name", help="host name to report (synthetic nodes)")
    args = ap.parse_args(argv)
    if args.interval <= 0:
        ap.error("--interval must be positive")
    replay = None
    if args.replay:
        data = json.loads(Path(args.replay).read_text())
        replay = data if isinstance(data, list) else [data]
    disks = args.disk or ([args.run] if args.run else [])
    agent = Agent(
        run_dir=args.run,
        disks=disks,
        interval=args.interval,
        hostname=args.host_name,
        replay=replay,
        use_nvml=not args.no_nvml,
        kmsg=args.kmsg or None,
    )
    # A bounded run (--count) ends by itself: its stdin may be closed from the start (runner.run).
    stdin_fd = sys.stdin.fileno() if (sys.stdin is not None and not args.count) else -1
    out = sys.stdout
    try:
        if args.count:
            time.sleep(min(0.25, args.interval))  # a one-shot sample needs a CPU window to mean anything
        next_due = time.monotonic()
        while True:
            try:
                out.write(json.dumps(agent.sample(), separators=(",", ":")) + "\n")
                out.flush()
            except BrokenPipeError:
                return 0
            if args.count and agent.seq >= args.count:
                return 0
            next_due += args.interval
            now = time.monotonic()
            next_due = max(next_due, now)  # fell behind (suspended, overloaded): do not burst to catch up
            if stdin_fd < 0:
                time.sleep(next_due - now)
            elif _stdin_closed(stdin_fd, next_due - now):
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        agent.close()


if __name__ == "__main__":
    sys.exit(main())
