"""Checks of where a run writes: a runs directory shared by every node, and disk room for the
checkpoints it keeps."""

from __future__ import annotations

from collections.abc import Mapping

from taehv_console.core.cluster.preflight.findings import E, I, W
from taehv_console.core.models import Finding, NodeFacts
from taehv_console.core.plan.footprint import parameter_count
from trainer.config import TrainConfig


def check_runs_shared(shared: Mapping[str, bool] | None, runs_dir: str, writer: str = "") -> list[Finding]:
    """`shared` maps each other node to whether it read the token `writer` wrote; None = not tested."""
    if not shared:
        return []
    missing = sorted(h for h, ok in shared.items() if not ok)
    if not missing:
        return [Finding("runs-shared", I, f"runs directory {runs_dir} is shared by all nodes")]
    return [
        Finding(
            "runs-not-shared",
            W,
            f"runs directory {runs_dir} is not shared: a file written on {writer or 'the master'} is not seen on "
            f"{', '.join(missing)}. Each node would write its own ZeRO shards of a checkpoint to its own disk, "
            "so no single node holds a complete checkpoint: rank 0 cannot verify one, and a resume needs "
            "every node's disk back in the same place",
            "put --runs on storage every node mounts at the same path (NFS, Lustre, a shared volume)",
        )
    ]


def checkpoint_bytes(cfg: TrainConfig) -> float:
    """One checkpoint: 16 bytes per parameter for weights, gradients' fp32 master and AdamW state
    (the planner's accounting), plus 4 per parameter for an EMA copy."""
    params = parameter_count(cfg.model).total
    return params * (16 + (4 if cfg.optim.ema_decay > 0 else 0))


def check_disk(facts: Mapping[str, NodeFacts], cfg: TrainConfig) -> list[Finding]:
    # keep_checkpoints complete ones plus the one being written, plus final/ and best/ weights.
    per_ckpt = checkpoint_bytes(cfg)
    need_gb = (per_ckpt * (cfg.schedule.keep_checkpoints + 1) + 2 * per_ckpt / 4) / 1e9
    out = []
    for host, f in facts.items():
        p = f.path("runs")
        if p is None or p.free_gb is None:
            continue
        if p.exists and not p.is_dir:
            out.append(
                Finding(
                    "runs-not-a-directory",
                    E,
                    f"{host}: runs path {p.path} is a file, not a directory",
                    "choose another --runs (a directory on storage every node sees)",
                    host,
                )
            )
        elif not p.writable:
            out.append(
                Finding(
                    "runs-not-writable",
                    E,
                    f"{host}: runs directory {p.path} is not writable",
                    f"choose a writable --runs or fix permissions on {host}",
                    host,
                )
            )
        elif p.free_gb < need_gb:
            out.append(
                Finding(
                    "disk-too-small",
                    E,
                    f"{host}: {p.free_gb:.1f} GB free at {p.fs_path}, {cfg.schedule.keep_checkpoints} kept "
                    f"checkpoints + one being written need ~{need_gb:.2f} GB",
                    "free space there, choose another --runs, or lower schedule.keep_checkpoints (≥ 2)",
                    host,
                )
            )
        elif p.free_gb < 2 * need_gb:
            out.append(
                Finding(
                    "disk-tight",
                    W,
                    f"{host}: {p.free_gb:.1f} GB free at {p.fs_path}, "
                    f"~{need_gb:.2f} GB needed: little room for logs and TensorBoard",
                    "",
                    host,
                )
            )
    return out
