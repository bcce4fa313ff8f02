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
import pickle
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
    if not verdict:
        verdict = ("Flight Recorder: every rank joined every recorded collective",)
    if not any("missing ranks" in line for line in verdict):
        # every rank joined (a GPU stream that never reaches the collective: a stuck kernel), or
        # some dumps are missing or unreadable to the analyser: what each dump still waits on says
        # where its rank stands
        verdict = (*verdict, *pending_collectives(trace_dir))
    return verdict, text


class _PlainData(pickle.Unpickler):
    """A dump holds dicts, lists and scalars only: refuse anything that would import or run code."""

    def find_class(self, module: str, name: str) -> object:
        raise pickle.UnpicklingError(f"{module}.{name}: a Flight Recorder dump holds plain data only")


def read_dump(path: str | Path) -> dict[str, object] | None:
    """One rank's dump as the recorder wrote it, or None when it is unreadable or not a dump."""
    try:
        with open(path, "rb") as f:
            data = _PlainData(f).load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError, IndexError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("entries"), list) else None


def _caller(entry: Mapping[str, object]) -> str:
    """The innermost frame outside torch of a recorded collective: the code that called it."""
    frames = entry.get("frames")
    for frame in frames if isinstance(frames, list) else []:
        name = str(frame.get("filename", "")) if isinstance(frame, dict) else ""
        if name and "/torch/" not in name:
            return f"{Path(name).name}:{frame.get('line')} {frame.get('name')}"
    return ""


def pending_collectives(trace_dir: str | Path) -> tuple[str, ...]:
    """One line per rank and group whose last enqueued collective never completed, read from each
    dump's pg_status, e.g. "rank 0: collective 4 (all_reduce, group 0:default_pg) enqueued and not
    completed (3 completed), called at train.py:412 train_step". The recorder marks a collective
    started only when NCCL timing is on; without it, "enqueued" does not say whether it started."""
    out = []
    dumps = {}
    for path in Path(trace_dir).glob(f"{TRACE_PREFIX}*"):
        suffix = path.name[len(TRACE_PREFIX) :]
        if suffix.isdigit():
            dumps[int(suffix)] = path
    for rank in sorted(dumps):
        dump = read_dump(dumps[rank])
        status = dump.get("pg_status") if dump else None
        if not dump or not isinstance(status, dict):
            continue
        config = dump.get("pg_config") if isinstance(dump.get("pg_config"), dict) else {}
        for group, st in status.items():
            if not isinstance(st, dict):
                continue
            enqueued, done = st.get("last_enqueued_collective"), st.get("last_completed_collective")
            started = st.get("last_started_collective")
            if not isinstance(enqueued, int) or not isinstance(done, int) or enqueued <= done:
                continue
            entry = next(
                (
                    e
                    for e in reversed(dump["entries"])  # type: ignore[call-overload]
                    if isinstance(e, dict)
                    and e.get("collective_seq_id") == enqueued
                    and str((e.get("process_group") or ("",))[0]) == str(group)
                ),
                {},
            )
            op = str(entry.get("profiling_name", "?")).split(":", 1)[-1]
            desc = (config.get(group) or {}).get("desc", "") if isinstance(config, dict) else ""
            state = (
                "started and not completed"
                if isinstance(started, int) and started >= enqueued
                else "enqueued and not completed"
            )
            line = f"rank {rank}: collective {enqueued} ({op}, group {group}{':' + desc if desc else ''}) {state} ({done} completed)"
            caller = _caller(entry)
            out.append(line + (f", called at {caller}" if caller else ""))
    return tuple(out)


def ranks_by_node(ranks: Iterable[int], gpus_per_node: int) -> Mapping[int, list[int]]:
    """Global rank -> machine rank as accelerate/torchrun number them (node-major)."""
    out: dict[int, list[int]] = {}
    for r in sorted(ranks):
        out.setdefault(r // max(1, gpus_per_node), []).append(r)
    return out
