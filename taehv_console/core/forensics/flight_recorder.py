"""PyTorch's Flight Recorder for a stalled NCCL run: the on-demand dump through each rank's pipe
(on the rank's node), and PyTorch's own analyser over the copied dumps, reduced to "which ranks are
missing from which collective". The launch environment that makes this possible, and what the
installed torch says about it, is in core/plan/flight_recorder.py.

The analyser (torch/distributed/flight_recorder) infers the rank from a common file prefix and
prints "Not all ranks joining collective, sequence number: N" ... "missing ranks: {1}".
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from taehv_console.core.plan.flight_recorder import ENV_BUFFER, TRACE_PREFIX

DUMP_WAIT_S = 15.0  # the pipe is polled every 1 s with DUMP_ON_TIMEOUT=1; writing a dump takes a moment more
ANALYSER_TIMEOUT_S = 120.0
ANALYSER = "torch.distributed.flight_recorder.fr_trace"


# ------------------------------------------------------------------------------ on the node


def _mtime_size(path: str) -> tuple[float, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def _poke(pipe: str) -> str:
    """Write one byte to a rank's dump pipe; '' when done, else why not."""
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return f"no pipe {pipe} (the rank is not NCCL, or {ENV_BUFFER} was not set at its start)"
    except OSError as err:
        if err.errno == errno.ENXIO:  # a FIFO nobody holds open for reading
            return f"nobody reads {pipe} (the rank has exited or not created its process group)"
        return f"cannot open {pipe}: {err.strerror}"
    try:
        os.write(fd, b"1")
    except OSError as err:
        return f"cannot write {pipe}: {err.strerror}"
    finally:
        os.close(fd)
    return ""


def dump_through_pipes(
    pipe_stem: str,
    trace_stem: str,
    ranks: Iterable[int],
    dest: str,
    *,
    timeout: float = DUMP_WAIT_S,
    settle_s: float = 0.3,
) -> dict:
    """Ask each rank on this node for a dump, wait for its file to be rewritten, copy it into
    `dest` under the analyser's naming (<prefix><rank>). Reply: {"kind", "error", "copied":
    {rank: path}, "missing": {rank: why}}."""
    ranks = sorted(set(ranks))
    before = {r: _mtime_size(f"{trace_stem}{r}") for r in ranks}
    missing: dict[int, str] = {}
    waiting = []
    for r in ranks:
        why = _poke(f"{pipe_stem}{r}.pipe")
        if why:
            missing[r] = why
        else:
            waiting.append(r)
    Path(dest).mkdir(parents=True, exist_ok=True)
    copied: dict[int, str] = {}
    seen: dict[int, tuple[float, int]] = {}
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for r in list(waiting):
            now = _mtime_size(f"{trace_stem}{r}")
            if now is None or now == before[r] or now[1] == 0:
                continue
            if seen.get(r) != now:  # still being written: look again after a pause
                seen[r] = now
                continue
            target = Path(dest) / f"{TRACE_PREFIX}{r}"
            tmp = target.with_name(f".{target.name}.tmp")
            shutil.copyfile(f"{trace_stem}{r}", tmp)
            os.replace(tmp, target)
            copied[r] = str(target)
            waiting.remove(r)
        if waiting:
            time.sleep(settle_s)
    for r in waiting:
        missing[r] = f"no dump within {timeout:g} s (a stopped or wedged rank cannot dump)"
    kind = "ok" if copied else "failed"
    error = "" if copied else "; ".join(f"rank {r}: {why}" for r, why in sorted(missing.items()))
    return {
        "kind": kind,
        "error": error,
        "copied": {str(k): v for k, v in copied.items()},
        "missing": {str(k): v for k, v in missing.items()},
    }


# -------------------------------------------------------------------------- on the console


def run_analyser(
    trace_dir: str | Path,
    *,
    python: str = sys.executable,
    allow_incomplete: bool = False,
    timeout: float = ANALYSER_TIMEOUT_S,
) -> tuple[int, str]:
    """PyTorch's analyser over a folder of dumps: (exit status, everything it printed)."""
    argv = [python, "-m", ANALYSER, "--prefix", TRACE_PREFIX, str(trace_dir)]
    if allow_incomplete:
        argv.insert(3, "--allow-incomplete-ranks")
    try:
        res = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return -1, f"the Flight Recorder analyser took longer than {timeout:g} s"
    except OSError as err:
        return -1, f"cannot run {python}: {err}"
    return res.returncode, (res.stdout or "") + (res.stderr or "")


_MISSING_FILES = re.compile(r"Missing dump files from ranks (\{[\d, ]*\})")
_UNDECIDED = re.compile(r"missed FR dumps from ranks \((\{[\d, ]*\})\)")
_HEADS = (
    (re.compile(r"Not all ranks joining collective, sequence number: (\d+)"), "missing"),
    (re.compile(r"Input/output mismatch in the collective sequence number: (\d+)"), "size mismatch"),
    (re.compile(r"Collective sequence number: (\d+) has errors"), "errors"),
)
_FIELD = re.compile(r"^(group info|collective|missing ranks|collective state|expected ranks): (.*)$")
_CULPRIT = re.compile(r"Culprit rank \d+; Error type: [A-Z_]+[^,\n]*")


def parse_analysis(text: str) -> tuple[str, ...]:
    """The analyser's verdict as one line per finding, e.g.
    "collective 4 (all_reduce, group 0:default_pg): missing ranks {1}"."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        for pattern, what in _HEADS:
            m = pattern.search(line)
            if not m:
                continue
            fields: dict[str, str] = {}
            culprits: list[str] = []
            j = i + 1
            while j < len(lines) and not any(p.search(lines[j]) for p, _ in _HEADS):
                f = _FIELD.match(lines[j].strip())
                if f and f.group(1) not in fields:
                    fields[f.group(1)] = f.group(2).strip()
                culprits += _CULPRIT.findall(lines[j])
                j += 1
            op = fields.get("collective", "?").split(":", 1)[-1]
            where = f"collective {m.group(1)} ({op}, group {fields.get('group info', '?')})"
            if what == "missing":
                out.append(f"{where}: missing ranks {fields.get('missing ranks', '?')}")
            elif what == "size mismatch":
                out.append(f"{where}: input/output sizes differ between ranks")
            else:
                out.append(f"{where}: " + ("; ".join(dict.fromkeys(culprits)) or "ranks disagree"))
            i = j - 1
            break
        i += 1
    m = _MISSING_FILES.search(text)
    if m:
        out.append(f"no Flight Recorder dump from ranks {m.group(1)}")
    undecided = dict.fromkeys(_UNDECIDED.findall(text))
    for ranks in undecided:
        line = f"no Flight Recorder dump from ranks {ranks}: the analyser cannot decide what is wrong"
        if line not in out and f"no Flight Recorder dump from ranks {ranks}" not in out:
            out.append(line)
    return tuple(dict.fromkeys(out))


def analyse(
    trace_dir: str | Path,
    *,
    python: str = sys.executable,
    incomplete: bool = False,
    timeout: float = ANALYSER_TIMEOUT_S,
) -> tuple[tuple[str, ...], str]:
    """Run the analyser and parse it: (verdict lines, raw output). `incomplete`: some ranks wrote
    no dump (a stopped rank cannot), so analyse what there is (--allow-incomplete-ranks); a strict
    run that finds dumps missing is repeated that way too."""
    code, text = run_analyser(trace_dir, python=python, allow_incomplete=incomplete, timeout=timeout)
    if code != 0 and not incomplete and _MISSING_FILES.search(text):
        code, more = run_analyser(trace_dir, python=python, allow_incomplete=True, timeout=timeout)
        text = text + "\n" + more
    verdict = parse_analysis(text)
    if code != 0 and not verdict:
        tail = text.strip().splitlines()[-1:] or [f"exit {code}"]
        verdict = (f"Flight Recorder analyser failed: {tail[0][:300]}",)
    elif not verdict:
        verdict = ("Flight Recorder: every rank joined every recorded collective",)
    return verdict, text


def ranks_by_node(ranks: Iterable[int], gpus_per_node: int) -> Mapping[int, list[int]]:
    """Global rank -> machine rank as accelerate/torchrun number them (node-major)."""
    out: dict[int, list[int]] = {}
    for r in sorted(ranks):
        out.setdefault(r // max(1, gpus_per_node), []).append(r)
    return out
