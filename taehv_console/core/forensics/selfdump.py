"""A rank's stack without py-spy: the trainer registers faulthandler on STACK_SIGNAL
(`trainer.events.install_stack_dump`), so on that signal it appends every thread's stack to
`stacks/rank-<r>.txt` in its run directory. This asks for one dump and reads it back.

Runs on the rank's node (in-process for this machine, `python -m taehv_console.core.forensics.node
selfdump` over SSH). It needs neither ptrace nor SYS_PTRACE, only the right to signal the process,
which is why forensics falls back to it where py-spy is missing or not permitted. The signal's
default action ends a process, so it is sent only to the process the file's newest header names
(pid and start time both match): never to a rank that predates the handler, nor to a reused pid.
A stopped process (SIGSTOP) would handle it only after SIGCONT, so it is not asked.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from taehv_console.core.cluster.spawn import read_proc_one
from taehv_console.core.forensics.pyspy import PyspyDump, PyspyThread
from trainer.events import STACK_SIGNAL

# Outcome kinds, also the JSON the node helper prints.
OK, UNSUPPORTED, STOPPED, GONE, FAILED = "ok", "unsupported", "stopped", "gone", "failed"
DUMP_TIMEOUT_S = 5.0
SETTLE_S = 0.3  # the dump is complete once the file has stopped growing this long

_HEADER = re.compile(
    r"^# taehv stack dumps: pid=(?P<pid>\d+) start=(?P<start>\d*) main=(?P<main>0x[0-9a-f]+)$", re.MULTILINE
)
_THREAD = re.compile(r"^(?:Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+)\b.*\(most recent call first\):$")
_FRAME = re.compile(r'^ {2}File "(?P<file>.*)", line (?P<line>\d+|\?\?\?) in (?P<func>.*)$')
_SITE = re.compile(r"^.*/(?:site|dist)-packages/")


def _short(path: str) -> str:
    """A library's file as py-spy shows it (from its package), the rest as written."""
    return _SITE.sub("", path)


def parse_faulthandler(text: str, pid: int, main: int) -> PyspyDump:
    """faulthandler's dump as a py-spy dump: threads in order, frames innermost
    first as "function (file:line)"; the thread whose id is `main` is named MainThread. Raises
    ValueError when the text holds no thread."""
    threads: list[PyspyThread] = []
    tid: int | None = None
    frames: list[str] = []

    def close() -> None:
        if tid is not None:
            name = "MainThread" if tid == main else ""
            threads.append(PyspyThread(tid=tid, status="", name=name, frames=tuple(frames)))

    for line in text.splitlines():
        if m := _THREAD.match(line):
            close()
            tid, frames = int(m["tid"], 16), []
        elif tid is not None and (m := _FRAME.match(line)):
            frames.append(f"{m['func']} ({_short(m['file'])}:{m['line']})")
    close()
    if not threads:
        raise ValueError(
            "faulthandler output holds no thread: " + (text.strip().splitlines() or [""])[0][:120]
        )
    # main_thread() looks for the pid first: a dump has no thread of that id, so MainThread decides
    return PyspyDump(pid=pid, command="", threads=tuple(threads))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def dump_by_signal(
    pid: int, stack_file: str | Path, *, timeout: float = DUMP_TIMEOUT_S, settle_s: float = SETTLE_S
) -> dict:
    """Ask process `pid` for its stacks and read them from `stack_file`. Returns the node helper's
    reply: {"kind": ok|unsupported|stopped|gone|failed, "text", "error", "state", "main"}; `text`
    is the new dump only, `main` the main thread's id from the header."""
    path = Path(stack_file)
    entry = read_proc_one(pid)
    reply: dict = {"kind": FAILED, "text": "", "error": "", "state": entry[3] if entry else "", "main": 0}
    if entry is None:
        reply.update(kind=GONE, error=f"no process {pid}")
        return reply
    if reply["state"] in ("T", "t"):
        reply.update(kind=STOPPED, error=f"process {pid} is stopped: it would dump only after SIGCONT")
        return reply
    try:
        headers = list(_HEADER.finditer(path.read_text(errors="replace")))
    except OSError as err:
        reply.update(
            kind=UNSUPPORTED, error=f"{path}: {err.strerror or err} (the rank has no stack dump handler)"
        )
        return reply
    newest = headers[-1] if headers else None
    if newest is None or int(newest["pid"]) != pid or newest["start"] != str(entry[4]):
        reply.update(
            kind=UNSUPPORTED,
            error=f"{path} was not written by process {pid} (an older rank, or one that predates the handler)",
        )
        return reply
    reply["main"] = int(newest["main"], 16)
    before = _size(path)
    try:
        os.kill(pid, STACK_SIGNAL)
    except ProcessLookupError:
        reply.update(kind=GONE, error=f"no process {pid}")
        return reply
    except PermissionError as err:
        reply.update(error=f"not permitted to signal process {pid}: {err}")
        return reply
    deadline = time.monotonic() + timeout
    size, changed = before, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now_size = _size(path)
        if now_size != size:
            size, changed = now_size, time.monotonic()
        elif size > before and time.monotonic() - changed >= settle_s:
            with open(path, "rb") as f:
                f.seek(before)
                reply.update(kind=OK, text=f.read(size - before).decode(errors="replace"))
            return reply
    reply.update(error=f"process {pid} wrote no stack within {timeout:g} s of the signal")
    return reply
