"""Why a run failed, told from the evidence: each node's launcher exit status, torchelastic's
"Root Cause (first observed failure)" block in the node's log, and the ranks' `error` events.

When one rank dies, every other rank fails soon after with a symptom (a closed connection, a
timeout); those arrive seconds apart and often before the real cause is reported. So the cause is
chosen by kind, not by arrival: a rank killed by a signal, then a rank's own error (not a peer
symptom), then a launcher that found the rendezvous port taken, then a node the console cannot
reach, then a launcher's root-cause block, then a launcher that vanished, then the earliest
symptom, and last a bare non-zero exit.
"""

from __future__ import annotations

import errno
import re
import signal
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from taehv_console.core.logscan import LogScanner
from taehv_console.core.run.state import Failure

_RULE = re.compile(r"\s*={10,}\s*")  # the line that closes torchelastic's block
# what a rank reports when a *peer* went away: a consequence, never the first failure
_PEER_SYMPTOM = re.compile(
    r"connection closed by peer|connection reset|broken pipe|econnreset|connection refused|"
    r"recvbytes|sendbytes|socket closed|read error|timed out|timeout|communicator was aborted|"
    r"software caused connection abort|terminated|sigterm|barrier",
    re.IGNORECASE,
)


# The rendezvous port taken on node 0 when its launcher starts: accelerate's own check, or the
# TCPStore server torchrun starts there. No rank runs, so nothing else explains the exit.
_PORT_IN_USE = re.compile(
    r"launch distributed communication on port `?(?P<accelerate>\d+)`?, but another process is utilizing it"
    r"|failed to listen on any local network address\. port: (?P<store>\d+).*?EADDRINUSE",
    re.IGNORECASE,
)


def port_in_use(text: str) -> tuple[int, str] | None:
    """The rendezvous port a launcher found taken, and the line that says so; None when none did."""
    for line in reversed(text.splitlines()):
        m = _PORT_IN_USE.search(line)
        if m:
            return int(m.group("accelerate") or m.group("store")), line.strip()[:300]
    return None


@dataclass(frozen=True)
class RootCause:
    rank: int | None
    local_rank: int | None
    exit_code: int | None
    host: str | None
    lines: tuple[str, ...]


def attempt_log_text(log: Path, node: int, attempt: int, limit: int = 256 << 10) -> str:
    """The part of a node's log written by this attempt (the wrapper starts each with a header);
    only the last `limit` bytes are read: the end is where a failure is told."""
    try:
        with open(log, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    marker = f"node {node} attempt {attempt} on "
    at = text.rfind(marker)
    if at >= 0:
        text = text[text.rfind("\n", 0, at) + 1 :]
    return text


def parse_root_cause(text: str) -> RootCause | None:
    """torchelastic's block (the last one in the text), read by the same LogScanner the monitor
    runs on the node logs, so the console and the dashboard agree on what it says."""
    lines = text.splitlines()
    scanner = LogScanner()
    found = scanner.feed("log", lines) + scanner.flush("log")
    blocks = [s for s in found if s.kind == "root_cause"]
    if not blocks:
        return None
    sig = blocks[-1]
    block: list[str] = []
    for line in lines[sig.line - 1 :]:
        if block and _RULE.fullmatch(line):
            break
        block.append(line.rstrip())
    return RootCause(
        rank=sig.rank,
        local_rank=sig.get("local_rank"),
        exit_code=sig.get("exitcode"),
        host=sig.host,
        lines=tuple(block[:20]),
    )


def tail_lines(text: str, n: int = 15) -> tuple[str, ...]:
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    return tuple(lines[-n:])


def is_peer_symptom(message: str) -> bool:
    return bool(_PEER_SYMPTOM.search(message or ""))


@dataclass(frozen=True)
class NodeEvidence:
    node: int
    host: str
    exit_code: int | None  # the launcher's (None: still running or unknown)
    ended: float | None
    root_cause: RootCause | None
    log_tail: tuple[str, ...] = ()
    port_taken: tuple[int, str] | None = None  # port_in_use() of this attempt's log


def choose_failure(
    nodes: Sequence[NodeEvidence],
    rank_errors: dict[int, dict],
    gpus_per_node: int,
    now: float,
    vanished: Sequence[tuple[int, str]] = (),
    unreachable: Sequence[tuple[int, str]] = (),
) -> Failure | None:
    """The first failure, by kind (see the module doc); None when nothing failed.

    `rank_errors`: rank -> its first `error` event this attempt. `vanished`: (node, host) whose
    launcher is gone without an exit status (killed with the wrapper, or the node lost).
    `unreachable`: (node, why) that the console cannot reach now: when no rank was signalled and
    none failed on its own, the node's loss is what the others' errors and exits show."""
    failing = [n for n in nodes if n.exit_code not in (None, 0)]
    by_node = {n.node: n for n in nodes}

    def node_of(rank: int) -> int:
        return rank // max(1, gpus_per_node)

    # 1. a rank killed by a signal: nothing else explains it. torchelastic prints its block once
    #    the workers are gone and only then tears down and exits, seconds later on a busy host: the
    #    block counts whether or not its launcher has exited yet (a peer's symptom would else win).
    signalled = [
        (n, n.root_cause, -n.root_cause.exit_code)
        for n in nodes
        if n.exit_code != 0
        and n.root_cause is not None
        and n.root_cause.exit_code is not None
        and n.root_cause.exit_code < 0
    ]
    if signalled:
        n, rc, signum = min(signalled, key=lambda e: e[0].ended or now)
        return Failure(
            reason=f"rank {rc.rank} was killed by signal {signum} ({_signal_name(signum)})",
            node=n.node,
            host=n.host,
            rank=rc.rank,
            local_rank=rc.local_rank,
            exit_code=rc.exit_code,
            log_lines=rc.lines,
            detected=now,
            kind="signal",
        )
    # 2. a rank's own error (not a peer's disappearance)
    own = {r: e for r, e in rank_errors.items() if not is_peer_symptom(str(e.get("message", "")))}
    if own:
        rank, event = min(own.items(), key=lambda kv: kv[1].get("time", now))
        ev = by_node.get(node_of(rank))
        return _rank_error(
            rank,
            event,
            node_of(rank),
            ev,
            gpus_per_node,
            now,
            tail=10,
            exit_code=ev.root_cause.exit_code if ev and ev.root_cause else None,
            kind="exception",
        )
    # 3. the rendezvous port taken where a launcher would listen: no rank of the attempt ran, and
    #    the peers' exits (or their rendezvous timeouts) follow from it
    taken = [n for n in failing if n.port_taken is not None]
    if taken:
        n = min(taken, key=lambda e: e.ended or now)
        assert n.port_taken is not None  # filtered just above
        port, line = n.port_taken
        return Failure(
            reason=f"the rendezvous port {port} is taken by another process on node {n.node} "
            f"({n.host}): no rank could start",
            node=n.node,
            host=n.host,
            exit_code=n.exit_code,
            log_lines=(line,),
            detected=now,
            kind="port-in-use",
        )
    # 4. a node that cannot be reached: the other nodes' ranks exit on their lost peers
    if unreachable:
        node, why = unreachable[0]
        ev = by_node.get(node)
        return Failure(
            reason=f"node {node} cannot be reached ({why}); the other nodes' errors are what its "
            "loss did to them",
            node=node,
            host=ev.host if ev else None,
            log_lines=ev.log_tail if ev else (),
            detected=now,
            kind="node-lost",
        )
    # 5. the earliest launcher to exit non-zero whose root-cause block names a rank (one whose
    #    own words were a lost peer's symptom exited because of that: a symptom, told below)
    symptoms = {r for r, e in rank_errors.items() if is_peer_symptom(str(e.get("message", "")))}
    with_block = [
        (n, n.root_cause) for n in failing if n.root_cause is not None and n.root_cause.rank not in symptoms
    ]
    if with_block:
        n, rc = min(with_block, key=lambda e: e[0].ended or now)
        return Failure(
            reason=f"rank {rc.rank} exited with {rc.exit_code}; the launcher on node {n.node} "
            f"exited with {n.exit_code}",
            node=n.node,
            host=n.host,
            rank=rc.rank,
            local_rank=rc.local_rank,
            exit_code=n.exit_code,
            log_lines=rc.lines,
            detected=now,
            kind="exit",
        )
    # 6. a launcher gone without a word (its wrapper killed, the node lost): the others' errors
    #    are what its disappearance did to them
    if vanished:
        node, host = vanished[0]
        ev = by_node.get(node)
        return Failure(
            reason=f"the launcher on node {node} ({host}) is gone without an exit status "
            "(killed, or the node was lost)",
            node=node,
            host=host,
            log_lines=ev.log_tail if ev else (),
            detected=now,
            kind="node-lost",
        )
    # 7. only symptoms: name the earliest, with its own words (better than a bare exit code)
    if rank_errors:
        rank, event = min(rank_errors.items(), key=lambda kv: kv[1].get("time", now))
        ev = by_node.get(node_of(rank))
        return _rank_error(
            rank,
            event,
            node_of(rank),
            ev,
            gpus_per_node,
            now,
            tail=6,
            exit_code=ev.exit_code if ev else None,
            kind="symptom",
        )
    # 8. a launcher exited non-zero and said nothing more
    if failing:
        n = min(failing, key=lambda e: e.ended or now)
        return Failure(
            reason=f"the launcher on node {n.node} exited with {n.exit_code}",
            node=n.node,
            host=n.host,
            exit_code=n.exit_code,
            log_lines=n.log_tail,
            detected=now,
            kind="exit",
        )
    return None


# What a full disk looks like in a rank's words: Python's OSError, or torch.save's stream writer.
_DISK_FULL = re.compile(r"\[Errno 28\]|No space left on device|ENOSPC", re.IGNORECASE)
_QUOTED_PATH = re.compile(r"""['"](/[^'"]+)['"]""")


def disk_full_path(*texts: str) -> str | None:
    """The path a disk-full error names ("" when it names none); None when the texts tell of no full disk."""
    text = "\n".join(t for t in texts if t)
    if not _DISK_FULL.search(text):
        return None
    hit = _DISK_FULL.search(text)
    assert hit is not None  # searched just above
    m = _QUOTED_PATH.search(text[hit.start() :]) or _QUOTED_PATH.search(text)
    return m.group(1) if m else ""


def write_failure_text(err: OSError, path: Path | str) -> str:
    """What the console says when it cannot write one of its own files (state.json, say)."""
    where = f"{socket.gethostname()} at {path}"
    if err.errno == errno.ENOSPC:
        return f"disk full on {where}"
    return f"could not write on {where}: {err.strerror or err}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _rank_error(
    rank: int,
    event: Mapping,
    node: int | None,
    ev: NodeEvidence | None,
    gpus_per_node: int,
    now: float,
    *,
    tail: int,
    exit_code: int | None,
    kind: str,
) -> Failure:
    """A failure told by a rank's own `error` event: its message and the last `tail` traceback lines."""
    message = event.get("message", "")
    lines = [f"rank {rank}: {message}"]
    lines += [ln.rstrip() for ln in str(event.get("traceback", "")).splitlines() if ln.strip()][-tail:]
    reason = f"rank {rank} failed: {message}"
    full = disk_full_path(str(message), str(event.get("traceback", "")), str(event.get("path", "")))
    if full is not None:
        host = ev.host if ev and ev.host else None
        where = f"node {node}" + (f" ({host})" if host else "")
        reason = f"disk full on {where} at {full or 'an unnamed path'}: rank {rank} failed: {message}"
        kind = "disk-full"
    return Failure(
        reason=reason[:500],
        node=node,
        host=ev.host if ev else None,
        rank=rank,
        local_rank=rank % max(1, gpus_per_node),
        exit_code=exit_code,
        log_lines=tuple(lines),
        detected=now,
        kind=kind,
    )
