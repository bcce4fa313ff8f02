"""The checkpoint protocol of docs/design.md: no partial checkpoint is ever taken for a good one.

step-<N>.tmp/ while ranks write; rank 0 checks the file set, writes manifest.json and COMPLETE,
fsyncs, renames to step-<N>/, replaces `latest`, and only then prunes (keeping >= 2 complete, and
never what `latest` names or what the run resumed from). Manifests carry an xxh3-128 hash of every
file, so a same-size corruption is caught. Verification reads manifests, sizes, hashes and zip
central directories; it never unpickles anything.

Timelines: resuming from a checkpoint older than the newest moves the newer ones into
`abandoned/`, so `latest`, resume and retention only ever see one line of history.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import mmap
import os
import re
import shutil
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from trainer.events import atomic_write_text

MANIFEST = "manifest.json"
COMPLETE = "COMPLETE"
DS_TAG = "ds"  # DeepSpeed's own files go under step-<N>/ds/
WEIGHTS = "weights.safetensors"  # consolidated fp32 weights: weights-only resume, evaluation
LATEST = "latest"
ABANDONED = "abandoned"  # checkpoints of a timeline a resume --from left behind (kept, never loaded)
STEP_RE = re.compile(r"^step-(\d+)$")
TMP_RE = re.compile(r"^step-(\d+)\.tmp$")
HASH_ALGO = "xxh3_128"  # the fastest of xxh64, xxh3, blake2b, sha256 here: benchmarks/checkpoint_hash.py


def rank_state_name(rank: int) -> str:
    return f"trainer/rank-{rank}.pt"


# Optional parts of a run and the files each adds to a checkpoint (rank 0 writes them).
PART_FILES = {"discriminator": ("trainer/discriminator.safetensors", "trainer/discriminator_optim.pt")}


def required_files(world_size: int, zero_stage: int, parts: tuple[str, ...] = ()) -> list[list[str]]:
    """Files a complete checkpoint must hold, each as alternatives (DeepSpeed prefixes its ZeRO
    shard names with `bf16_` in bf16 mode); `parts` names optional parts the run has (PART_FILES)."""
    req: list[list[str]] = [[WEIGHTS], ["trainer/state.json"]]
    req += [[name] for part in parts for name in PART_FILES[part]]
    req += [[rank_state_name(r)] for r in range(world_size)]
    if zero_stage == 3:
        req += [[f"{DS_TAG}/zero_pp_rank_{r}_mp_rank_00_model_states.pt"] for r in range(world_size)]
    else:
        req.append([f"{DS_TAG}/mp_rank_00_model_states.pt"])
    if zero_stage >= 1:
        for r in range(world_size):
            name = f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"
            req.append([f"{DS_TAG}/{name}", f"{DS_TAG}/bf16_{name}"])
    return req


def _zip_problem(path: Path) -> str | None:
    """torch.save writes zip archives: read the central directory (no unpickling)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError) as err:
        return f"{path.name}: not a readable archive ({err})"
    if not any(n.endswith("data.pkl") for n in names):
        return f"{path.name}: archive has no data.pkl"
    return None


def _list_files(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.stat().st_size
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in (MANIFEST, COMPLETE)
    }


def check_files(ckpt_dir: Path, world_size: int, zero_stage: int, parts: tuple[str, ...] = ()) -> list[str]:
    """Problems with the files in a checkpoint being finished (empty list = good)."""
    present = _list_files(ckpt_dir)
    problems = []
    for alternatives in required_files(world_size, zero_stage, parts):
        found = [a for a in alternatives if a in present]
        if not found:
            problems.append(f"missing {alternatives[0]}")
        elif present[found[0]] == 0:
            problems.append(f"empty {found[0]}")
    for name in present:
        if name.endswith(".pt"):
            bad = _zip_problem(ckpt_dir / name)
            if bad:
                problems.append(bad)
    return problems


def file_hash(path: Path) -> str:
    """`xxh3_128:<hex>` of a file's bytes. Hashed through mmap: no copy into Python buffers, which
    made chunked reads 5x slower than the hash itself (benchmarks/checkpoint_hash.py)."""

    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return f"{HASH_ALGO}:{xxhash.xxh3_128(b'').hexdigest()}"
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return f"{HASH_ALGO}:{xxhash.xxh3_128(m).hexdigest()}"


def _fsync_tree(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def finalize(
    tmp_dir: Path,
    step: int,
    world_size: int,
    zero_stage: int,
    extra: dict | None = None,
    parts: tuple[str, ...] = (),
) -> Path:
    """Rank 0, after every rank has written into tmp_dir: check, seal and publish. Raises
    CheckpointError (and publishes nothing) when the file set is incomplete."""
    problems = check_files(tmp_dir, world_size, zero_stage, parts)
    if problems:
        raise CheckpointError(f"{tmp_dir}: checkpoint incomplete: " + "; ".join(problems[:8]))
    files = _list_files(tmp_dir)
    manifest = {
        "step": step,
        "world_size": world_size,
        "zero_stage": zero_stage,
        "files": files,
        "hashes": {name: file_hash(tmp_dir / name) for name in files},
        "bytes": sum(files.values()),
        "created": time.time(),
        **(extra or {}),
    }
    atomic_write_text(tmp_dir / MANIFEST, json.dumps(manifest, indent=1), fsync=True)
    atomic_write_text(tmp_dir / COMPLETE, f"{step}\n", fsync=True)
    _fsync_tree(tmp_dir)
    final = tmp_dir.parent / f"step-{step}"
    if final.exists():  # a re-save of the same step (e.g. resumed and stopped at once): newest wins
        shutil.rmtree(final)
    os.rename(tmp_dir, final)
    write_latest(tmp_dir.parent, final.name)
    return final


def _nearly_full(path: Path, below: int = 16 << 20) -> bool:
    try:
        return shutil.disk_usage(path).free < below
    except OSError:
        return False


@contextlib.contextmanager
def disk_full_named(where: Path) -> Iterator[None]:
    """A write into `where` that fails on a full filesystem raises ENOSPC naming `where`: torch.save's
    stream writer says only "file write failed", and the console reports "disk full on node X at
    PATH" from these words."""
    try:
        yield
    except OSError as err:
        if err.errno == errno.ENOSPC and err.filename:
            raise
        if err.errno == errno.ENOSPC or _nearly_full(where):
            raise OSError(errno.ENOSPC, f"No space left on device ({err})", str(where)) from err
        raise
    except RuntimeError as err:
        if _nearly_full(where):
            raise OSError(errno.ENOSPC, f"No space left on device ({err})", str(where)) from err
        raise


def write_latest(root: Path, name: str) -> None:
    atomic_write_text(Path(root) / LATEST, f"{name}\n", fsync=True)


def read_latest(root: Path) -> tuple[str | None, str | None]:
    """(the checkpoint name `latest` holds, the problem with the file). Never raises: a reader of
    a half-broken run directory must keep working, and garbage is reported, not trusted."""
    path = Path(root) / LATEST
    try:
        with open(path, "rb") as f:
            raw = f.read(4097)
    except FileNotFoundError:
        return None, None
    except OSError as err:
        return None, f"{path}: unreadable ({err.strerror or err})"
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, f"{path}: not text ({len(raw)} bytes of binary data); ignored"
    if not STEP_RE.match(text):
        shown = text if len(text) <= 60 else text[:57] + "..."
        return None, f"{path}: holds {shown!r}, not a checkpoint name (step-<N>); ignored"
    return text, None


class CheckpointError(RuntimeError):
    pass


@dataclass(frozen=True)
class CheckpointStatus:
    path: Path
    step: int
    state: str  # complete | in_progress | incomplete
    problems: tuple[str, ...] = ()
    bytes: int = 0
    world_size: int | None = None
    zero_stage: int | None = None
    mtime: float = 0.0

    @property
    def ok(self) -> bool:
        return self.state == "complete"


def verify(path: Path, deep: bool = True, hashes: bool = False) -> CheckpointStatus:
    """Whether a checkpoint directory can be trusted, from its manifest, sizes and zip directories;
    with `hashes`, every file's bytes against the manifest's hash too (reads the whole checkpoint:
    done before a resume and on request, not on every poll). Manifests written before hashes
    existed verify without them."""
    path = Path(path)
    m = STEP_RE.match(path.name)
    t = TMP_RE.match(path.name)
    named = m or t
    step = int(named.group(1)) if named else -1
    mtime = path.stat().st_mtime if path.exists() else 0.0
    if t:
        return CheckpointStatus(path, step, "in_progress", ("still being written (.tmp)",), mtime=mtime)
    problems: list[str] = []
    if not (path / COMPLETE).is_file():
        problems.append("no COMPLETE marker")
    try:
        manifest = json.loads((path / MANIFEST).read_bytes())
    except (OSError, ValueError, RecursionError) as err:  # ValueError: not JSON, not UTF-8
        problems.append(f"manifest unreadable ({type(err).__name__})")
        return CheckpointStatus(path, step, "incomplete", tuple(problems), mtime=mtime)
    damaged = manifest_problem(manifest)
    if damaged:
        problems.append(f"{MANIFEST} damaged: {damaged}")
        return CheckpointStatus(path, step, "incomplete", tuple(problems), mtime=mtime)
    if manifest.get("step") != step:
        problems.append(f"manifest says step {manifest.get('step')}, directory says {step}")
    expected_hashes = manifest.get("hashes") or {}
    for name, size in manifest.get("files", {}).items():
        f = path / name
        if not f.is_file():
            problems.append(f"missing {name}")
        elif f.stat().st_size != size:
            problems.append(f"{name}: {f.stat().st_size} bytes, manifest says {size}")
        elif hashes and name in expected_hashes and file_hash(f) != expected_hashes[name]:
            problems.append(f"{name}: contents differ from the manifest's hash (corrupted, same size)")
        elif deep and name.endswith(".pt"):
            bad = _zip_problem(f)
            if bad:
                problems.append(bad)
    return CheckpointStatus(
        path,
        step,
        "incomplete" if problems else "complete",
        tuple(problems),
        bytes=int(manifest.get("bytes", 0)),
        world_size=manifest.get("world_size"),
        zero_stage=manifest.get("zero_stage"),
        mtime=mtime,
    )


def manifest_problem(manifest: object) -> str | None:
    """What makes a parsed manifest unusable ("" / None when nothing does): its shape is checked
    here, where it is read, so a damaged one (an array, file sizes that are not numbers) makes the
    checkpoint incomplete with why, never an exception in a reader. Unknown keys are ignored."""
    if not isinstance(manifest, dict):
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
        return f"a JSON {kind.get(type(manifest), 'null')} where an object belongs"
    files, hashes = manifest.get("files", {}), manifest.get("hashes") or {}
    if not isinstance(files, dict) or not all(type(v) is int and v >= 0 for v in files.values()):
        return "field files: not an object of file sizes"
    if not isinstance(hashes, dict) or not all(isinstance(v, str) for v in hashes.values()):
        return "field hashes: not an object of hashes"
    for key in ("step", "bytes", "world_size", "zero_stage"):
        value = manifest.get(key)
        if value is not None and type(value) is not int:
            return f"field {key}: {str(value)[:40]!r} is not an integer"
    return None


@dataclass
class Scan:
    complete: list[CheckpointStatus] = field(default_factory=list)  # newest first
    skipped: list[CheckpointStatus] = field(default_factory=list)  # .tmp and bad ones, with why

    @property
    def newest(self) -> CheckpointStatus | None:
        return self.complete[0] if self.complete else None


def scan(root: Path, deep: bool = True) -> Scan:
    result = Scan()
    if not root.is_dir():
        return result
    entries = []
    for p in root.iterdir():
        m = STEP_RE.match(p.name) or TMP_RE.match(p.name)
        if m and p.is_dir():
            entries.append((int(m.group(1)), p))
    for _step, p in sorted(entries, key=lambda e: (e[0], e[1].name), reverse=True):
        st = verify(p, deep=deep)
        (result.complete if st.ok else result.skipped).append(st)
    return result


def resolve_resume(root: Path, spec: str) -> tuple[CheckpointStatus | None, list[CheckpointStatus]]:
    """`latest` -> the newest checkpoint that verifies, hashes included (never a .tmp or bad one);
    else a path. Skipped ones come back with why; so does a `latest` file that is garbage or
    disagrees (it is a pointer for people and tools: the checkpoints themselves decide)."""
    if spec != "latest":
        st = verify(Path(spec), hashes=True)
        if not st.ok:
            raise CheckpointError(f"{spec}: cannot resume from it: {st.state}: " + "; ".join(st.problems))
        return st, []
    s = scan(root)
    skipped = list(s.skipped)
    chosen = None
    for candidate in s.complete:
        st = verify(candidate.path, hashes=True)
        if st.ok:
            chosen = st
            break
        skipped.append(st)
    named, problem = read_latest(root)
    if problem is None and named is not None and (chosen is None or named != chosen.path.name):
        problem = f"{Path(root) / LATEST}: names {named}, " + (
            f"but {chosen.path.name} is the newest that verifies" if chosen else "and no checkpoint verifies"
        )
    if problem:
        skipped.append(CheckpointStatus(Path(root) / LATEST, -1, "invalid", (problem,)))
    return chosen, skipped


def abandon_newer(root: Path, step: int) -> Path | None:
    """Resuming at `step` starts a new timeline: checkpoints of this run past it (complete or
    not) move to abandoned/<time>-at-step-<step>/, kept for the user but out of resume's and
    retention's way, so a later `resume latest` cannot continue the old line. Returns where
    they went (None when nothing was newer)."""
    root = Path(root)
    newer = []
    if root.is_dir():
        for p in root.iterdir():
            m = STEP_RE.match(p.name) or TMP_RE.match(p.name)
            if m and p.is_dir() and int(m.group(1)) > step:
                newer.append(p)
    if not newer:
        return None
    dest = root / ABANDONED / f"{time.strftime('%Y%m%d-%H%M%S')}-at-step-{step}"
    dest.mkdir(parents=True, exist_ok=True)
    for p in newer:
        os.rename(p, dest / p.name)
    return dest


def prune(root: Path, keep: int, current_step: int, protect: tuple[Path, ...] = ()) -> list[Path]:
    """After a successful save only: drop the oldest complete checkpoints beyond `keep` (never
    fewer than 2) and abandoned .tmp directories of earlier steps. Never removed, whatever their
    age: what `latest` names and `protect` (the checkpoint this run resumed from)."""
    keep = max(keep, 2)
    removed = []
    s = scan(root, deep=False)
    named, _ = read_latest(root)
    kept = {Path(p).resolve() for p in protect}
    if named:
        kept.add((Path(root) / named).resolve())
    for st in s.complete[keep:]:
        if st.path.resolve() in kept:
            continue
        shutil.rmtree(st.path, ignore_errors=True)
        removed.append(st.path)
    for st in s.skipped:
        if st.state == "in_progress" and st.step < current_step:
            shutil.rmtree(st.path, ignore_errors=True)
            removed.append(st.path)
    return removed


# ------------------------------------------------------------------ another world size
UNIVERSAL = "universal"  # DeepSpeed's universal checkpoint, converted into step-<N>/universal/


def universal_command(ckpt_dir: Path) -> list[str]:
    """The conversion that makes a checkpoint loadable at any world size (argv). `inject_missing_
    state` lets checkpoints written before the model carried DeepSpeed's universal info convert."""
    ckpt_dir = Path(ckpt_dir)
    return [
        "python",
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(ckpt_dir / DS_TAG),
        "--output_folder",
        str(ckpt_dir / UNIVERSAL),
        "--inject_missing_state",
    ]


def universal_problem(ckpt_dir: Path) -> str | None:
    """Why step-<N>/universal cannot be loaded (None: it can). The converter writes the per-
    parameter folders first and the common optimizer state last, so that file means finished."""
    u = Path(ckpt_dir) / UNIVERSAL
    if not u.is_dir():
        return f"no {UNIVERSAL}/ conversion in {ckpt_dir}"
    # model states: mp_rank_00_... under ZeRO-1/2, zero_pp_rank_0_mp_rank_00_... under ZeRO-3
    model = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
    if not any((u / name).is_file() for name in model):
        return f"{u}: conversion unfinished (no {model[0]} or {model[1]}); run it again"
    if not (u / "zero" / "optimizer_state.pt").is_file():
        return f"{u}: conversion unfinished (no zero/optimizer_state.pt); run it again"
    return None


def rescaled_data_position(consumed: int, old_world: int, new_world: int, n: int) -> int:
    """Samples one rank has consumed, carried to another world size. Every world deals epoch e's
    permutation round-robin, so the first k*world samples of it are what `world` ranks consumed
    after k each: keeping the epoch and the global offset continues the same order."""
    old_per_rank, new_per_rank = math.ceil(n / old_world), math.ceil(n / new_world)
    epoch, offset = divmod(consumed, old_per_rank)
    return epoch * new_per_rank + (offset * old_world) // new_world
