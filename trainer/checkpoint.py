"""The checkpoint protocol of DESIGN.md: no partial checkpoint is ever taken for a good one.

step-<N>.tmp/ while ranks write; rank 0 checks the file set, writes manifest.json and COMPLETE,
fsyncs, renames to step-<N>/, replaces `latest`, and only then prunes (keeping >= 2 complete).
Verification reads manifests, sizes and zip central directories; it never unpickles anything.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from trainer.events import atomic_write_text

MANIFEST = "manifest.json"
COMPLETE = "COMPLETE"
DS_TAG = "ds"  # DeepSpeed's own files go under step-<N>/ds/
WEIGHTS = "weights.safetensors"  # consolidated fp32 weights: weights-only resume, evaluation
STEP_RE = re.compile(r"^step-(\d+)$")
TMP_RE = re.compile(r"^step-(\d+)\.tmp$")


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


def finalize(tmp_dir: Path, step: int, world_size: int, zero_stage: int, extra: dict | None = None,
             parts: tuple[str, ...] = ()) -> Path:
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
    atomic_write_text(tmp_dir.parent / "latest", f"step-{step}\n", fsync=True)
    return final


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


def verify(path: Path, deep: bool = True) -> CheckpointStatus:
    """Whether a checkpoint directory can be trusted, from its manifest, sizes and zip directories."""
    path = Path(path)
    m = STEP_RE.match(path.name)
    t = TMP_RE.match(path.name)
    step = int((m or t).group(1)) if (m or t) else -1
    mtime = path.stat().st_mtime if path.exists() else 0.0
    if t:
        return CheckpointStatus(path, step, "in_progress", ("still being written (.tmp)",), mtime=mtime)
    problems: list[str] = []
    if not (path / COMPLETE).is_file():
        problems.append("no COMPLETE marker")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as err:
        problems.append(f"manifest unreadable ({type(err).__name__})")
        return CheckpointStatus(path, step, "incomplete", tuple(problems), mtime=mtime)
    if manifest.get("step") != step:
        problems.append(f"manifest says step {manifest.get('step')}, directory says {step}")
    for name, size in manifest.get("files", {}).items():
        f = path / name
        if not f.is_file():
            problems.append(f"missing {name}")
        elif f.stat().st_size != size:
            problems.append(f"{name}: {f.stat().st_size} bytes, manifest says {size}")
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
    """`latest` -> the newest checkpoint that verifies (never a .tmp or bad one); else a path."""
    if spec == "latest":
        s = scan(root)
        return s.newest, s.skipped
    st = verify(Path(spec))
    if not st.ok:
        raise CheckpointError(f"{spec}: cannot resume from it: {st.state}: " + "; ".join(st.problems))
    return st, []


def prune(root: Path, keep: int, current_step: int) -> list[Path]:
    """After a successful save only: drop the oldest complete checkpoints beyond `keep` (never
    fewer than 2) and abandoned .tmp directories of earlier steps."""
    keep = max(keep, 2)
    removed = []
    s = scan(root, deep=False)
    for st in s.complete[keep:]:
        shutil.rmtree(st.path, ignore_errors=True)
        removed.append(st.path)
    for st in s.skipped:
        if st.state == "in_progress" and st.step < current_step:
            shutil.rmtree(st.path, ignore_errors=True)
            removed.append(st.path)
    return removed
