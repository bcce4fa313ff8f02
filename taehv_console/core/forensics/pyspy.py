"""py-spy on one process of this node: find the binary, dump the stack, tell "not installed" and
"not permitted" apart from other failures, and parse the dump into threads and frames.

Runs on the rank's node (in-process for this machine, `python -m taehv_console.core.forensics.node
pyspy` over SSH). A SIGSTOPped process cannot be dumped the default way: py-spy suspends the target
with ptrace and gets back "Failed to suspend process" (seen with py-spy 0.4.3), so a stopped
process is read with --nonblocking, which reads its memory without suspending it. That is safe
here because a stopped process does not change under the reader.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from taehv_console.core.cluster.spawn import read_proc_one

PYSPY = "py-spy"
DUMP_TIMEOUT_S = 30.0

# Outcome kinds, also the JSON the node helper prints.
OK, MISSING, DENIED, GONE, FAILED = "ok", "missing", "denied", "gone", "failed"

# What py-spy prints when it may not read another process (seen here: root without CAP_SYS_PTRACE
# on another user's process gives "Permission denied (os error 13)" while reading its executable;
# a container whose seccomp profile blocks process_vm_readv gets py-spy's own "Permission Denied"
# line and its docker hint, both strings of the py-spy 0.4.3 binary).
_DENIED = re.compile(
    r"Permission Denied: Try running again with elevated permissions"
    r"|SYS_PTRACE capability"
    r"|Permission denied \(os error 13\)"
    r"|Operation not permitted \(os error 1\)",
)
_GONE = re.compile(r"No such file or directory \(os error 2\)|No such process \(os error 3\)")
_SUSPEND_FAILED = "Failed to suspend process"

_THREAD = re.compile(r'^Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<status>[^)]*)\)(?::\s*"(?P<name>.*)")?\s*$')
_FRAME = re.compile(r"^ {2,6}(?P<frame>\S.*?)\s*$")  # deeper lines are --locals values
_HEADER = re.compile(r"^Process (?P<pid>\d+): (?P<cmd>.*)$")


@dataclass(frozen=True)
class PyspyThread:
    tid: int
    status: str  # idle | active | active+gil ...
    name: str
    frames: tuple[str, ...]  # innermost first, "function (file:line)"


@dataclass(frozen=True)
class PyspyDump:
    pid: int
    command: str
    threads: tuple[PyspyThread, ...]

    def main_thread(self) -> PyspyThread | None:
        """The thread whose id is the process id (CPython's main thread on Linux), else the one
        named MainThread, else the first."""
        for t in self.threads:
            if t.tid == self.pid:
                return t
        for t in self.threads:
            if t.name == "MainThread":
                return t
        return self.threads[0] if self.threads else None


def parse_dump(text: str) -> PyspyDump:
    """Parse `py-spy dump` output. Raises ValueError when it holds no thread (not a dump)."""
    pid, command = 0, ""
    threads: list[PyspyThread] = []
    current: dict | None = None
    frames: list[str] = []

    def close() -> None:
        if current is not None:
            threads.append(PyspyThread(current["tid"], current["status"], current["name"], tuple(frames)))

    for line in text.splitlines():
        if not line.strip():
            continue
        m = _THREAD.match(line)
        if m:
            close()
            tid = m["tid"]
            current = {
                "tid": int(tid, 16) if tid.startswith("0x") else int(tid),
                "status": m["status"],
                "name": m["name"] or "",
            }
            frames = []
            continue
        if current is None:
            # the header: "Process P: <command line>" (which may span lines: python -c '...')
            # and "Python vX (path)"
            m = _HEADER.match(line)
            if m and not pid:
                pid, command = int(m["pid"]), m["cmd"]
            continue
        m = _FRAME.match(line)
        if m:
            frames.append(m["frame"])
        # anything else inside a thread (--locals blocks, native markers) is kept out of frames
    close()
    if not threads:
        raise ValueError("py-spy output holds no thread: " + (text.strip().splitlines() or [""])[0][:120])
    return PyspyDump(pid=pid, command=command, threads=tuple(threads))


def classify_failure(text: str) -> str:
    """DENIED, GONE or FAILED for a py-spy run that did not produce a dump."""
    if _DENIED.search(text):
        return DENIED
    if _GONE.search(text):
        return GONE
    return FAILED


def error_summary(text: str) -> str:
    """py-spy's error and its causes on one line, without its Rust backtrace."""
    keep = []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("Stack backtrace"):
            if s:
                break
            continue
        keep.append(re.sub(r"^(Error: |Caused by:|\d+: )", "", s).strip())
    return "; ".join(k for k in keep if k)[:400]


def find_pyspy(python: str | None = None) -> str | None:
    """py-spy beside the node's python (the same virtualenv's bin), else on PATH. The python path
    is not resolved: a venv's python is a link to the base interpreter, whose bin has no py-spy."""
    if python:
        candidate = Path(python).parent / PYSPY
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(PYSPY)


def ptrace_scope() -> str:
    """Yama's ptrace_scope on this machine ('' without Yama): 1 or more also refuses py-spy."""
    try:
        return Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return ""


def dump_process(
    pid: int, *, pyspy: str | None = None, python: str | None = None, timeout: float = DUMP_TIMEOUT_S
) -> dict:
    """Dump one process's stack on this machine. Returns the node helper's reply:
    {"kind": ok|missing|denied|gone|failed, "text", "error", "pyspy", "state", "nonblocking"}."""
    exe = pyspy or find_pyspy(python)
    entry = read_proc_one(pid)
    state = entry[3] if entry else ""
    reply = {
        "kind": FAILED,
        "text": "",
        "error": "",
        "pyspy": exe or "",
        "state": state,
        "nonblocking": False,
        "ptrace_scope": ptrace_scope(),
    }
    if exe is None:
        reply.update(
            kind=MISSING, error=f"{PYSPY} is not installed (not beside {python or 'python'}, not on PATH)"
        )
        return reply
    if entry is None:
        reply.update(kind=GONE, error=f"no process {pid}")
        return reply
    # a stopped process cannot be suspended by py-spy: read it without suspending
    nonblocking = state in ("T", "t")
    for _ in range(2):
        argv = [exe, "dump", "--pid", str(pid)] + (["--nonblocking"] if nonblocking else [])
        try:
            res = subprocess.run(
                argv, check=False, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            reply.update(
                kind=FAILED, error=f"{PYSPY} dump took longer than {timeout:g} s", nonblocking=nonblocking
            )
            return reply
        except OSError as err:
            reply.update(kind=MISSING, error=f"{exe}: {err}")
            return reply
        reply["nonblocking"] = nonblocking
        if res.returncode == 0 and "Thread " in res.stdout:
            reply.update(kind=OK, text=res.stdout)
            return reply
        output = (res.stderr or "") + (res.stdout or "")
        if _SUSPEND_FAILED in output and not nonblocking:
            nonblocking = True  # stopped between our look and py-spy's attach
            continue
        reply.update(
            kind=classify_failure(output),
            error=error_summary(output) or f"exit {res.returncode}",
            text=res.stdout,
        )
        return reply
    return reply
