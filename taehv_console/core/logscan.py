"""Scan launcher logs (`logs/node-<i>.log`) for the health signals of FACTS.md: the NCCL watchdog
timeout (SeqNum, op, timeout) and the last enqueued/completed work counts per rank, `NCCL WARN`,
torchelastic's root-cause block, `invalid device ordinal` and out-of-memory (plus a peer connection
closed under a rank, the victim's side of a crash).

Only those patterns raise anything, so noise stays quiet by construction; `NCCL INFO` lines and
deprecation notices are dropped before the patterns that could misread them (`NCCL INFO
NCCL_DEBUG set by environment to WARN` is not a warning). Lines arrive incrementally from the
tailer; a root-cause block split across two reads is completed on the next one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LogSignal:
    """A line (or torchelastic block) in a node log that means something. `fields` holds what the
    line says in numbers: seq, op, timeout_ms, ran_ms, last_enqueued, last_completed, exitcode, pid."""

    kind: str
    severity: str  # error | warning | info
    source: str  # log file, e.g. node-0.log
    line: int  # 1-based line number in that file
    text: str
    rank: int | None = None
    host: str | None = None
    fields: tuple[tuple[str, Any], ...] = ()
    seen: float = 0.0  # console clock when read

    def get(self, name: str, default: Any = None) -> Any:
        for k, v in self.fields:
            if k == name:
                return v
        return default


# torchrun prefixes each worker line with "[rank3]:" (torch >= 2.2); the NCCL process group puts the
# rank in its log prefix: "[Rank 1]", "[PG 0 (default_pg) Rank 1]", "[PG ID 0 PG GUID 0(default_pg) Rank 4]".
_RANK_PREFIX = re.compile(r"\[rank(\d+)\]:")
_PG_RANK = re.compile(r"\[(?:PG [^\]]*?)?Rank (\d+)\]")
_WATCHDOG = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
    r"[^)]*?Timeout\(ms\)=(?P<timeout>\d+)\) ran for (?P<ran>\d+) milliseconds"
)
_PROGRESS = re.compile(
    r"last enqueued NCCL work: (?P<enq>-?\d+), last completed NCCL work: (?P<done>-?\d+)", re.IGNORECASE
)
_DUMP_FROM = re.compile(r"collective timeout from\s+rank (\d+)")
_NCCL_WARN = re.compile(
    r"(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:(?P<src>\S+:\d+) )?NCCL WARN (?P<msg>.*)"
)
_CHILD_FAILED = re.compile(
    r"failed \(exitcode: (?P<code>-?\d+)\) local_rank: (?P<lr>\d+) \(pid: (?P<pid>\d+)\)"
)
_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
    r"|Cuda failure 'out of memory'"
)
_ORDINAL = re.compile(r"invalid device ordinal", re.IGNORECASE)
# gloo (and NCCL's socket transport) when a peer process died: the rank printing it is a victim,
# the dead peer is the cause (the root-cause block names it).
_PEER_LOST = re.compile(r"Connection (?:closed|reset) by peer ?(?P<peer>\S*)")
_ROOT_CAUSE = "Root Cause (first observed failure):"
_FAILURES = "Failures:"  # torchelastic's summary: the other failures, then the root cause
_BLOCK_RULE = re.compile(r"^-{20,}$|^\s*<NO_OTHER_FAILURES>\s*$")
_BLOCK_FIELD = re.compile(r"^\s+(?P<key>[\w ]+?)\s*:\s?(?P<value>.*)$")
_BLOCK_INDEX = re.compile(r"^\s*\[\d+\]:\s*$")
_BENIGN = ("NCCL INFO", "is deprecated")


@dataclass(frozen=True)
class LineMatch:
    """What one line says (before it is placed in a file and time)."""

    kind: str
    severity: str
    rank: int | None = None
    host: str | None = None
    fields: tuple[tuple[str, Any], ...] = ()


def _rank(line: str) -> int | None:
    m = _RANK_PREFIX.search(line) or _PG_RANK.search(line)
    return int(m.group(1)) if m else None


def scan_line(line: str) -> LineMatch | None:
    """The signal one line carries, or None. Root-cause blocks span lines: see LogScanner."""
    if "Watchdog caught" in line:
        m = _WATCHDOG.search(line)
        if m:
            return LineMatch(
                "watchdog_timeout",
                "error",
                _rank(line),
                None,
                (
                    ("seq", int(m["seq"])),
                    ("op", m["op"]),
                    ("timeout_ms", int(m["timeout"])),
                    ("ran_ms", int(m["ran"])),
                ),
            )
    if "NCCL work:" in line:
        m = _PROGRESS.search(line)
        if m:
            fields: tuple[tuple[str, Any], ...] = (
                ("last_enqueued", int(m["enq"])),
                ("last_completed", int(m["done"])),
            )
            d = _DUMP_FROM.search(line)
            if d:
                fields += (("timeout_from_rank", int(d.group(1))),)
            # evidence for the laggard, not an alarm of its own: the watchdog line is the alarm
            return LineMatch("nccl_progress", "info", _rank(line), None, fields)
    if any(b in line for b in _BENIGN):
        return None
    if "NCCL WARN" in line:
        m = _NCCL_WARN.search(line)
        if m:
            kind = "cuda_oom" if _OOM.search(m["msg"]) else "nccl_warn"
            return LineMatch(
                kind,
                "error" if kind == "cuda_oom" else "warning",
                _rank(line),
                m["host"],
                (
                    ("pid", int(m["pid"])),
                    ("device", int(m["dev"])),
                    ("where", m["src"] or ""),
                    ("message", m["msg"].strip()),
                ),
            )
    if "exitcode" in line:
        m = _CHILD_FAILED.search(line)
        if m:
            return LineMatch(
                "child_failed",
                "error",
                None,
                None,
                (("exitcode", int(m["code"])), ("local_rank", int(m["lr"])), ("pid", int(m["pid"]))),
            )
    if _OOM.search(line):
        return LineMatch("cuda_oom", "error", _rank(line))
    if "ordinal" in line and _ORDINAL.search(line):
        return LineMatch("invalid_device_ordinal", "error", _rank(line))
    if "by peer" in line:
        m = _PEER_LOST.search(line)
        if m:
            return LineMatch("peer_lost", "warning", _rank(line), None, (("peer", m["peer"].rstrip(".")),))
    return None


@dataclass
class _Block:
    """torchelastic's failure summary: its entries in order, and which one it calls the root cause
    (`line` is then the root cause's line)."""

    line: int
    entries: list[dict[str, str]] = field(default_factory=list)
    root: int | None = None

    def add(self, key: str, value: str) -> None:
        if not self.entries:
            self.entries.append({})
        self.entries[-1][key] = value

    def cause(self) -> tuple[dict[str, str], dict[str, str] | None]:
        """The entry that caused the failure, and torchelastic's own pick where that is another.
        torchelastic orders by the second a failure was observed and breaks ties by rank, so a rank
        that exited with an error because its peer was killed (gloo: connection closed) is named
        when both were seen in the same poll. A rank killed by a signal in that same second is
        the cause: a peer that merely exited cannot have killed it."""
        named = self.entries[self.root or 0]
        if (_int(named.get("exitcode")) or 0) < 0:
            return named, None
        for e in self.entries:
            if e is not named and e.get("time") == named.get("time") and (_int(e.get("exitcode")) or 0) < 0:
                return e, named
        return named, None


def _int(text: str | None) -> int | None:
    m = re.match(r"\s*(-?\d+)", text or "")
    return int(m.group(1)) if m else None


class LogScanner:
    """Signals from many log files fed line by line. Repeats of one event (the watchdog line is
    printed three times: the line, the thread's exception, `terminate ... what()`) come out once."""

    def __init__(self, max_keys: int = 10_000):
        self._lines: dict[str, int] = {}
        self._blocks: dict[str, _Block] = {}
        self._seen: dict[tuple, None] = {}
        self._max_keys = max_keys

    def reset(self, source: str) -> None:
        """The file was replaced or truncated: line numbers start again."""
        self._lines.pop(source, None)
        self._blocks.pop(source, None)

    def feed(self, source: str, lines: list[str], now: float = 0.0) -> list[LogSignal]:
        out: list[LogSignal] = []
        n = self._lines.get(source, 0)
        for text in lines:
            n += 1
            block = self._blocks.get(source)
            if block is not None:
                if _BLOCK_INDEX.match(text):
                    block.entries.append({})
                    continue
                if _ROOT_CAUSE in text:
                    block.line, block.root = n, len(block.entries)
                    continue
                m = _BLOCK_FIELD.match(text)
                if m:
                    block.add(m["key"].strip(), m["value"].strip())
                    continue
                if _BLOCK_RULE.match(text):
                    continue
                self._emit_block(source, now, out)  # the block ended; this line is read as usual
            if text.strip() == _FAILURES:
                self._blocks[source] = _Block(n)
                continue
            if _ROOT_CAUSE in text:  # a summary whose "Failures:" line was not seen
                self._blocks[source] = _Block(n, root=0)
                continue
            hit = scan_line(text)
            if hit is not None:
                self._add(
                    LogSignal(
                        hit.kind,
                        hit.severity,
                        source,
                        n,
                        text.strip()[:500],
                        hit.rank,
                        hit.host,
                        hit.fields,
                        now,
                    ),
                    out,
                )
        self._lines[source] = n
        return out

    def pending(self) -> list[str]:
        """Sources with a root-cause block still open."""
        return list(self._blocks)

    def flush(self, source: str, now: float = 0.0) -> list[LogSignal]:
        """A block at the very end of a file that has gone quiet is as complete as it will get."""
        out: list[LogSignal] = []
        if source in self._blocks:
            self._emit_block(source, now, out)
        return out

    def _emit_block(self, source: str, now: float, out: list[LogSignal]) -> None:
        b = self._blocks.pop(source)
        if b.root is None or not b.entries:
            return  # a "Failures:" list that never reached its root cause says nothing on its own
        f, named = b.cause()
        exit_text = f.get("exitcode", "")
        fields: list[tuple[str, Any]] = [
            ("exitcode", _int(exit_text)),
            ("pid", _int(exit_text.partition("pid:")[2])),
        ]
        if f.get("local_rank") is not None or "local_rank" in f.get("rank", ""):
            fields.append(("local_rank", _int(f.get("rank", "").partition("local_rank:")[2])))
        if f.get("traceback"):
            fields.append(("traceback", f["traceback"]))
        if f.get("time"):
            fields.append(("time", f["time"]))
        text = (
            f"root cause: rank {f.get('rank', '?')} on {f.get('host', '?')}, exitcode {exit_text or '?'}"
            + (f" ({f['traceback']})" if "Signal" in f.get("traceback", "") else "")
            + (
                f"; torchrun named rank {named.get('rank', '?')} (exitcode {named.get('exitcode', '?')}),"
                " seen in the same second"
                if named is not None
                else ""
            )
        )
        if named is not None:
            fields.append(("torchrun_root_rank", _int(named.get("rank"))))
        self._add(
            LogSignal(
                "root_cause",
                "error",
                source,
                b.line,
                text,
                _int(f.get("rank")),
                f.get("host"),
                tuple(fields),
                now,
            ),
            out,
        )

    def _add(self, sig: LogSignal, out: list[LogSignal]) -> None:
        if sig.kind == "watchdog_timeout":
            key: tuple = (sig.source, sig.kind, sig.rank, sig.get("seq"))
        elif sig.kind == "peer_lost":  # the error line and the traceback's last line say it twice
            key = (sig.source, sig.kind, sig.rank, sig.get("peer"))
        elif sig.kind == "nccl_progress":
            key = (sig.source, sig.kind, sig.rank, sig.get("last_enqueued"), sig.get("last_completed"))
        else:
            key = (sig.source, sig.line, sig.kind)
        if key in self._seen:
            return
        self._seen[key] = None
        if len(self._seen) > self._max_keys:
            self._seen.pop(next(iter(self._seen)))
        out.append(sig)
