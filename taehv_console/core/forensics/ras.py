"""NCCL's RAS service (NCCL >= 2.24): which NCCL versions may be asked at all, the plain-text query
on a node's localhost:28028, and its verdict (DEAD / INCOMPLETE / MISMATCH ranks) in one line.

The protocol is NCCL's own client's (src/ras/client.cc): send "CLIENT PROTOCOL 2", read "SERVER
PROTOCOL n", optionally "TIMEOUT s" -> "OK", then "VERBOSE STATUS" and read until NCCL closes the
connection. The output format follows NCCL's troubleshooting/ras documentation ("Errors" and
"Warnings" sections; "#0-0 (hash) INCOMPLETE ... The missing rank: 21"; "DEAD ... Process P on node
N managing GPU g"); NCCL says the format varies between releases, so unknown lines are ignored.

Asking RAS has crashed training jobs, so a query is refused unless the NCCL version is in a range
known to be safe (RAS_VERSION_POLICY, each row with its reason), never before the ranks finished a
step (communicator init), and at most every RAS_MIN_INTERVAL_S per node (the caller keeps time).
"""

from __future__ import annotations

import ctypes
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path

RAS_PORT = 28028
RAS_PROTOCOL = 2
RAS_MIN_INTERVAL_S = 15.0
QUERY_TIMEOUT_S = 20.0  # RAS waits up to ~5 s per unresponsive peer (its collective leg timeout)
RAS_TIMEOUT_S = 5  # what we ask RAS to wait for other processes (the ncclras default)

Version = tuple[int, int, int]


@dataclass(frozen=True)
class VersionRule:
    first: Version  # inclusive
    last: Version  # exclusive
    allowed: bool
    reason: str


# Known problems of RAS queries, from NVIDIA/nccl issues and release notes. Rows are checked in
# order; the first whose range holds the version decides.
RAS_VERSION_POLICY: tuple[VersionRule, ...] = (
    VersionRule((0, 0, 0), (2, 24, 0), False, "NCCL before 2.24 has no RAS service"),
    VersionRule(
        (2, 24, 0),
        (2, 27, 3),
        False,
        "a RAS report generated while a communicator initialises crashes the process "
        "(NVIDIA/nccl#1669, #1718; fixed in 2.27.3)",
    ),
    VersionRule(
        (2, 27, 3),
        (2, 29, 2),
        False,
        "VERBOSE STATUS for a communicator with missing ranks corrupts memory, which is "
        "exactly a stall (NVIDIA/nccl#1762; fixed in 2.29.2)",
    ),
    VersionRule(
        (2, 29, 2),
        (99, 0, 0),
        True,
        "no known crash after communicator init (NVIDIA/nccl#2346, 2.29.7: a report during "
        "communicator churn can crash; queried only after the first step)",
    ),
)


def parse_version(text: str) -> Version | None:
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text or "")
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def version_from_code(code: int) -> Version:
    """ncclGetVersion's integer: major*10000 + minor*100 + patch since 2.9 (major*1000 before)."""
    if code >= 10000:
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


def may_query(version: Version | None) -> tuple[bool, str]:
    """(allowed, reason) for asking RAS of a job running this NCCL version."""
    if version is None:
        return False, "the NCCL version of the ranks is unknown"
    for rule in RAS_VERSION_POLICY:
        if rule.first <= version < rule.last:
            return rule.allowed, rule.reason
    return False, f"NCCL {'.'.join(map(str, version))} is outside the known versions"


# ------------------------------------------------------------------------------ on the node


def loaded_nccl(pid: int, proc_root: str = "/proc") -> str:
    """Path of the libnccl a process has mapped, '' when it has none (gloo, CPU)."""
    try:
        with open(os.path.join(proc_root, str(pid), "maps")) as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                if "/libnccl" in path and ".so" in path:
                    return path.strip()
    except OSError:
        return ""
    return ""


def nccl_version_of(lib: str) -> Version | None:
    """NCCL version of a libnccl file: the pip wheel's metadata beside it, else ncclGetVersion."""
    p = Path(lib)
    # site-packages/nvidia/nccl/lib/libnccl.so.2 -> site-packages/nvidia_nccl_cu12-2.27.5.dist-info
    site = p.parent.parent.parent.parent
    for info in sorted(site.glob("nvidia_nccl_cu*-*.dist-info")):
        v = parse_version(info.name)
        if v:
            return v
    v = parse_version(p.name)
    if v:
        return v
    try:
        code = ctypes.c_int(0)
        if ctypes.CDLL(str(p)).ncclGetVersion(ctypes.byref(code)) == 0 and code.value:
            return version_from_code(code.value)
    except (OSError, AttributeError):
        return None
    return None


def _recv_line(sock: socket.socket, deadline: float) -> str:
    buf = b""
    while not buf.endswith(b"\n"):
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace")


def query(
    *, host: str = "localhost", port: int = RAS_PORT, timeout: float = QUERY_TIMEOUT_S, verbose: bool = True
) -> dict:
    """Ask the RAS service for its status. Reply {"kind": ok|unavailable|failed, "text", "error"}."""
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout=min(5.0, timeout))
    except OSError as err:
        return {
            "kind": "unavailable",
            "text": "",
            "error": f"nothing answers on {host}:{port} ({err.strerror or err}): RAS off or no NCCL job here",
        }
    try:
        with sock:
            sock.sendall(f"CLIENT PROTOCOL {RAS_PROTOCOL}\n".encode())
            hello = _recv_line(sock, deadline)
            if not hello.upper().startswith("SERVER PROTOCOL "):
                return {
                    "kind": "failed",
                    "text": hello,
                    "error": f"unexpected RAS greeting {hello.strip()[:80]!r}",
                }
            sock.sendall(f"TIMEOUT {RAS_TIMEOUT_S}\n".encode())
            ok = _recv_line(sock, deadline)
            if ok.strip().upper() != "OK":
                return {"kind": "failed", "text": ok, "error": f"RAS refused TIMEOUT: {ok.strip()[:80]!r}"}
            sock.sendall(b"VERBOSE STATUS\n" if verbose else b"STATUS\n")
            chunks: list[bytes] = []
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return {
                        "kind": "failed",
                        "text": b"".join(chunks).decode(errors="replace"),
                        "error": f"RAS did not finish its report within {timeout:g} s",
                    }
                sock.settimeout(left)
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
    except OSError as err:
        return {"kind": "failed", "text": "", "error": f"RAS connection failed: {err}"}
    return {"kind": "ok", "text": b"".join(chunks).decode(errors="replace"), "error": ""}


def query_for(pid: int, *, port: int = RAS_PORT, timeout: float = QUERY_TIMEOUT_S) -> dict:
    """On the node of rank process `pid`: find its NCCL, check the version policy, then query."""
    lib = loaded_nccl(pid)
    if not lib:
        return {
            "kind": "unavailable",
            "text": "",
            "version": "",
            "error": f"process {pid} has no NCCL loaded (gloo or CPU run): RAS does not apply",
        }
    version = nccl_version_of(lib)
    shown = ".".join(map(str, version)) if version else "?"
    allowed, reason = may_query(version)
    if not allowed:
        return {"kind": "refused", "text": "", "version": shown, "error": f"NCCL {shown}: {reason}"}
    out = query(port=port, timeout=timeout)
    out["version"] = shown
    return out


# -------------------------------------------------------------------------------- verdict

_SECTION = re.compile(r"^\s*(Errors|Warnings)\s*$")
_RULE = re.compile(r"^\s*=+\s*$")
_COMM_HEAD = re.compile(r"^\s*#(\d+-\d+) \(([0-9a-fA-F]+)\) ([A-Z]+)")
_MISSING_RANKS = re.compile(r"The missing ranks?: ([\d, -]+)")
_PROCESS = re.compile(r"Process (\d+) on node (\S+) managing GPU (\S+)")
_RANK_LINE = re.compile(r"Rank (\d+) -- GPU \S+ managed by process \d+ on node (\S+)")
_COUNTS = re.compile(r"(\d+) ranks? ha(?:ve|s) launched up to operation (\d+)")
_SUMMARY_ROW = re.compile(r"^\s*(\d+)\s+\d+\s+\d+\s+[\d-]+\s+\d+\s+\d+\s+([A-Z]+)\s+([A-Z]+)\s*$")


@dataclass(frozen=True)
class RasVerdict:
    dead: tuple[str, ...]  # "process P on node N (GPU g)"
    incomplete: tuple[str, ...]  # "communicator #0-0: missing ranks 21"
    mismatch: tuple[str, ...]  # "communicator #0-0: ranks 1, 3 behind (op 6649 vs 6650)"
    statuses: tuple[str, ...]  # per summary group: "RUNNING/INCOMPLETE"

    @property
    def healthy(self) -> bool:
        return not (self.dead or self.incomplete or self.mismatch)

    def line(self) -> str:
        parts = []
        if self.dead:
            parts.append("DEAD " + "; ".join(self.dead))
        if self.incomplete:
            parts.append("INCOMPLETE " + "; ".join(self.incomplete))
        if self.mismatch:
            parts.append("MISMATCH " + "; ".join(self.mismatch))
        return " | ".join(parts) if parts else "RAS: every communicator RUNNING/OK"


def parse_status(text: str) -> RasVerdict:
    """Reduce a RAS text report to its verdict. Raises ValueError when the text is no RAS report."""
    if "Communicators" not in text and "Job summary" not in text and "Errors" not in text:
        raise ValueError("not a RAS status report: " + (text.strip().splitlines() or [""])[0][:100])
    dead: list[str] = []
    incomplete: list[str] = []
    mismatch: list[str] = []
    statuses: list[str] = []
    section = ""
    block: list[str] = []
    head: str = ""

    def flush() -> None:
        if not head:
            return
        body = "\n".join(block)
        m = _COMM_HEAD.match(head)
        if head.strip() == "DEAD":
            dead.extend(f"process {p} on node {n} (GPU {g})" for p, n, g in _PROCESS.findall(body))
        elif head.strip() == "INCOMPLETE":  # job processes that sent nothing (stopped, wedged)
            incomplete.extend(
                f"no answer from process {p} on node {n} (GPU {g})" for p, n, g in _PROCESS.findall(body)
            )
        elif m and m.group(3) == "INCOMPLETE":
            ranks = _MISSING_RANKS.findall(body)
            if ranks:
                incomplete.append(f"communicator #{m.group(1)}: missing ranks {ranks[0].strip()}")
        elif m and m.group(3) == "MISMATCH":
            counts = [(int(n), int(op)) for n, op in _COUNTS.findall(body)]
            ranks = sorted({int(r) for r, _ in _RANK_LINE.findall(body)}, key=int)
            if counts and len(counts) >= 2:
                lo = min(op for _, op in counts)
                hi = max(op for _, op in counts)
                who = ", ".join(map(str, ranks)) if ranks else "some ranks"
                mismatch.append(
                    f"communicator #{m.group(1)}: ranks {who} at op {lo} vs {hi}"
                    if lo != hi
                    else f"communicator #{m.group(1)}: ranks {who} differ"
                )
            else:
                reason = next((ln.strip() for ln in block if ln.strip()), "ranks disagree")
                mismatch.append(f"communicator #{m.group(1)}: {reason}")

    for raw in text.splitlines():
        line = raw.rstrip()
        if _RULE.match(line):
            continue
        s = _SECTION.match(line)
        if s:
            flush()
            head, block, section = "", [], s.group(1)
            continue
        row = _SUMMARY_ROW.match(line)
        if row and not section:
            statuses.append(f"group {row.group(1)}: {row.group(2)}/{row.group(3)}")
            continue
        if not section:
            continue
        if line and not line.startswith((" ", "\t")):
            flush()
            head, block = line.strip(), []
        elif head:
            block.append(line)
    flush()
    return RasVerdict(
        tuple(dict.fromkeys(dead)),
        tuple(dict.fromkeys(incomplete)),
        tuple(dict.fromkeys(mismatch)),
        tuple(statuses),
    )
