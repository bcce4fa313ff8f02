"""Checks of what training reads on every node: the data source, the teacher VAE or its latent
cache, and whether the data loader keeps up with the planned throughput."""

from __future__ import annotations

import math
from collections.abc import Mapping

from taehv_console.core.cluster.preflight.findings import E, I, W
from taehv_console.core.models import Finding, NodeFacts
from trainer.config import TrainConfig
from trainer.families import FAMILIES
from trainer.teacher_geometry import TEACHER_CLASSES


def check_data(facts: Mapping[str, NodeFacts], data_source: str) -> list[Finding]:
    if not data_source:
        # Only the smoke preset runs without data (the console generates clips for it).
        return [
            Finding(
                "data-not-set",
                W,
                "no data source: data.source is empty; only generated demo clips can be trained on",
                "--data DIR (a directory of videos or an annotation JSON)",
            )
        ]
    out = []
    for host, f in facts.items():
        p = f.path("data")
        if p is None:
            continue
        if not p.exists:
            out.append(
                Finding(
                    "data-missing",
                    E,
                    f"{host}: data source {p.path} does not exist",
                    f"mount or copy the data to the same path on {host}",
                    host,
                )
            )
        elif not p.readable:
            out.append(
                Finding(
                    "data-unreadable",
                    E,
                    f"{host}: data source {p.path} is not readable",
                    f"fix its permissions for the user the console logs in as on {host}",
                    host,
                )
            )
    return out


def check_videos(scans: Mapping[str, Mapping]) -> list[Finding]:
    """Each node's scan of its videos (nodecheck `scan-videos`: each opened and its first frame
    decoded, within a time budget): unreadable ones named, a warning while readable ones remain and
    an error when none are; a scan the budget cut short says how far it got."""
    out: list[Finding] = []
    for host, s in scans.items():
        if not s.get("ok"):
            out.append(
                Finding(
                    "videos-not-scanned",
                    W,
                    f"{host}: the videos could not be scanned: {s.get('error') or 'no answer'}",
                    "run `taehv-train bench-data DIR` on that node to see why",
                    host,
                )
            )
            continue
        total, scanned, bad = int(s.get("videos", 0)), int(s.get("scanned", 0)), int(s.get("unreadable", 0))
        named = [f"{v['path']} ({v['why']})" for v in s.get("named", ())]
        if bad:
            more = f" and {bad - len(named)} more" if bad > len(named) else ""
            readable = int(s.get("readable", 0))
            none_left = readable == 0 and scanned == total
            out.append(
                Finding(
                    "videos-unreadable",
                    E if none_left else W,
                    f"{host}: {bad} of {scanned} video(s) scanned give no frame"
                    + (": none is readable" if none_left else ", training skips them")
                    + f": {'; '.join(named)}{more}",
                    "replace or remove them (a re-encode: ffmpeg -i IN -c:v libx264 OUT.mp4)",
                    host,
                )
            )
        if scanned < total:
            out.append(
                Finding(
                    "videos-scan-partial",
                    I,
                    f"{host}: scanned {scanned} of {total} videos within {s.get('seconds', 0)} s; "
                    "the rest are checked as training reads them",
                    node=host,
                )
            )
    return out


def _teacher_class(cfg: TrainConfig) -> str:
    """The diffusers class of the run family's teacher (a `custom` student: any video VAE of its shapes)."""
    fam = FAMILIES.get(cfg.model.family)
    return fam.teacher_class if fam is not None else "video VAE (" + ", ".join(TEACHER_CLASSES) + ")"


def check_recipe(cfg: TrainConfig, answers: Mapping[str, dict | str]) -> list[Finding]:
    """The teacher (or its latent cache) as each node answered nodecheck `teacher`/`latent-cache`:
    a dict, or the text of a failure to run it. A distilling run never starts without one."""
    if not cfg.loss.distilling:
        return []
    cached = bool(cfg.loss.teacher_cache)
    path = cfg.loss.teacher_cache if cached else cfg.loss.teacher
    what = "latent cache (loss.teacher_cache)" if cached else "teacher VAE (loss.teacher)"
    fix = (
        (
            "build it with `taehv-train cache-latents --run RUN` on storage every node mounts, or unset "
            "loss.teacher_cache to run the teacher online"
        )
        if cached
        else (
            f"put a diffusers {_teacher_class(cfg)} directory (save_pretrained) at that path on every node, "
            "or unset loss.teacher to train by reconstruction only"
        )
    )
    out = []
    for host, a in answers.items():
        if isinstance(a, str) or not a:
            out.append(
                Finding(
                    "teacher-unchecked",
                    E,
                    f"{host}: could not check the {what} {path}: {a or 'no answer'}",
                    fix,
                    host,
                )
            )
        elif not a.get("ok"):
            out.append(Finding("teacher-unusable", E, f"{host}: {what} {path}: {a.get('error')}", fix, host))
        elif not cached:
            shape = "x".join(str(v) for v in a.get("latent_shape", []))
            frames, height, width = a.get("clip") or (8, 16, 16)  # a node of before families: taehv's clip
            out.append(
                Finding(
                    "teacher-ok",
                    I,
                    f"{host}: teacher {path} loads as model.family = {cfg.model.family}'s; a {frames}-frame "
                    f"{height}x{width} clip gives latents {shape} (latents x C x h x w), as the student's",
                    "",
                    host,
                )
            )
        else:
            out.append(
                Finding(
                    "latent-cache-ok", I, f"{host}: latent cache {path}: {a.get('clips')} clips", "", host
                )
            )
    return out


def check_loader(
    measured: Mapping[str, Mapping],
    cfg: TrainConfig,
    clips_per_s_per_gpu: Mapping[str, float],
    facts: Mapping[str, NodeFacts] | None = None,
) -> list[Finding]:
    """Each node's loader measurement (nodecheck `loader`: CPU-s per clip on its own videos) against
    the planner's clips/s per GPU: data.num_workers workers, one core each, must keep up. A video
    the scan found unreadable is neither sampled nor named here (check_videos names it, once)."""
    out: list[Finding] = []
    workers = cfg.data.num_workers
    d = cfg.data
    clip = f"{d.frames}x{d.height}x{d.width}"
    for host, m in measured.items():
        if m.get("none_readable"):
            continue  # nothing to measure: the scan's videos-unreadable error names the videos
        if not m.get("ok"):
            why = m.get("error") or "no answer"
            if m.get("data_error"):
                out.append(
                    Finding(
                        "data-gives-no-clips",
                        E,
                        f"{host}: the data loader cannot make a {clip} clip: {why}",
                        "fix the videos or the data settings it names",
                        host,
                    )
                )
            else:
                out.append(
                    Finding(
                        "loader-not-measured",
                        W,
                        f"{host}: the loader could not be measured: {why}",
                        "run `taehv-train bench-data DIR` on that node to see why",
                        host,
                    )
                )
            continue
        cpu_s = float(m["load_cpu_s"])
        target = clips_per_s_per_gpu.get(host, 0.0)
        per_worker = 1.0 / cpu_s if cpu_s > 0 else float("inf")
        # Without workers the rank loads in its own process: one worker's rate, paid inside the step.
        rate = per_worker * max(workers, 1)
        need = max(1, math.ceil(target * cpu_s))
        what = (
            f"{host}: the loader takes {cpu_s:.3f} CPU-s per {clip} clip of {m.get('source', 'these')} "
            f"videos ({per_worker:.1f} clips/s per worker)"
        )
        if rate < target:
            fix = f"--set data.num_workers={need}"
            f = facts.get(host) if facts else None
            cores = need * cfg.topology.gpus_per_node
            if f is not None and f.cpu_count and cores > f.cpu_count:
                fix += (
                    f" ({cores} loader processes per node, {host} has {f.cpu_count} CPUs: also "
                    "pre-scale the videos towards the training size, which makes decoding cheaper)"
                )
            out.append(
                Finding(
                    "loader-too-slow",
                    W,
                    f"{what}: {workers} worker(s) per GPU give {rate:.1f} clips/s, the plan "
                    f"assumes {target:.1f} clips/s per GPU, so GPUs would wait for data",
                    fix,
                    host,
                )
            )
        else:
            out.append(
                Finding(
                    "loader-ok",
                    I,
                    f"{what}: {workers} worker(s) per GPU give {rate:.1f} clips/s "
                    f"(the plan assumes {target:.1f})",
                    "",
                    host,
                )
            )
        skipped = m.get("skipped") or []
        if skipped:
            out.append(
                Finding(
                    "loader-skipped-videos",
                    W,
                    f"{host}: {len(skipped)} of the sampled videos gave no clip: " + "; ".join(skipped[:3]),
                    "training skips them too (each reported as a data event); fix or remove them",
                    host,
                )
            )
    return out
