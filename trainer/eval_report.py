"""What `eval` leaves behind: every figure as one JSON-ready dict, and a contact sheet PNG built
from the samples' strips (input, reconstruction, amplified error; a second model's rows below)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from trainer.evaluate import SHEET_CLIPS, EvalResult, Figures, ModelScore
from trainer.samples import AMPLIFY, strip, write_png

SHEET_FRAMES = 8  # frames per clip on it, evenly spaced


def _clean(value: object) -> object:
    """JSON has no NaN or infinity: None instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _model_dict(m: ModelScore) -> dict:
    out = {
        "label": m.source.label,
        "family": m.family,
        "weights": str(m.source.path),
        "config": m.note,
        "overall": asdict(m.overall),
    }
    if m.teacher_vs_teacher:
        out["teacher"] = {
            "psnr_vs_teacher": _mean(m.teacher_vs_teacher),
            "psnr_vs_input": _mean(m.teacher_vs_input),
        }
    return out


def result_dict(result: EvalResult, files: dict[str, str] | None = None) -> dict:
    """Every figure: overall per model and baseline, then per clip, in the models' order."""
    s = result.section
    out: dict = {
        "data": result.data,
        "family": result.family,  # the first model's; each model's is in "models"
        "frames": s.frames,
        "scored_frames": result.scored_frames,  # T = 4k frames decode to 4k-3 (the causal warm-up)
        "height": s.height,
        "width": s.width,
        "device": result.device,
        "streaming": result.streaming,
        "models": [_model_dict(m) for m in result.models],
        "baselines": {
            name: asdict(Figures.mean([b[name] for b in result.baselines]))
            for name in ("mid_grey", "mean_colour")
        },
    }
    if result.teacher_reference and result.teacher is not None:
        own = Figures.mean(result.teacher_reference)
        # the teacher's own encode + decode vs the input, on the frames the models are scored on
        out["teacher"] = {
            "path": result.teacher.path,
            "class": result.teacher.class_name,
            "overall": asdict(own),
        }
        out["teacher_psnr_vs_input"] = own.psnr
    clips = []
    for i, clip in enumerate(result.clips):
        entry: dict = {
            "source": str(clip.source),
            "models": [asdict(m.clips[i]) for m in result.models],
            **{name: asdict(fig) for name, fig in result.baselines[i].items()},
        }
        if result.teacher_reference:
            entry["teacher"] = {
                "own": asdict(result.teacher_reference[i]),
                "teacher_psnr_vs_input": result.teacher_reference[i].psnr,
                "models": [
                    {"psnr_vs_teacher": m.teacher_vs_teacher[i], "psnr_vs_input": m.teacher_vs_input[i]}
                    for m in result.models
                ],
            }
        clips.append(entry)
    out["clips"] = clips
    out["skipped"] = [{"path": p, "reason": r} for p, r in result.skipped]
    out.update(files or {})
    return {k: _clean(v) for k, v in out.items()}


def contact_sheet(result: EvalResult) -> np.ndarray:
    """uint8 image: for each of the first SHEET_CLIPS clips, the input row, then each model's
    reconstruction and its error ×AMPLIFY, frames evenly spaced; a black band between clips."""
    blocks: list[np.ndarray] = []
    for i, clip in enumerate(result.clips[:SHEET_CLIPS]):
        assert clip.video is not None  # kept for the first SHEET_CLIPS
        y0 = result.models[0].recon[i]
        pick = torch.from_numpy(
            np.unique(np.linspace(0, y0.shape[0] - 1, SHEET_FRAMES).round().astype(np.int64))
        )
        x = clip.video[: y0.shape[0]][pick]
        h = x.shape[2]
        rows = [strip(x, y0[pick], AMPLIFY)]
        rows += [strip(x, m.recon[i][pick], AMPLIFY)[h:] for m in result.models[1:]]
        block = np.concatenate(rows, axis=0)
        if blocks:
            blocks.append(np.zeros((4, block.shape[1], 3), np.uint8))
        blocks.append(block)
    width = max(b.shape[1] for b in blocks)
    return np.concatenate([np.pad(b, ((0, 0), (0, width - b.shape[1]), (0, 0))) for b in blocks], axis=0)


def default_out_dir(result: EvalResult) -> Path:
    """RUN/eval/ for weights of a run; otherwise the folder of the weights file."""
    source = result.models[0].source
    return source.run_dir / "eval" if source.run_dir is not None else source.path.parent


def write_report(result: EvalResult, out_dir: Path | None = None) -> dict:
    """Write eval-<label>.png (the contact sheet) and eval-<label>.json into out_dir; the figures
    with the two paths added."""
    out = Path(out_dir) if out_dir is not None else default_out_dir(result)
    out.mkdir(parents=True, exist_ok=True)
    label = "-vs-".join(m.source.label for m in result.models)
    png = write_png(out / f"eval-{label}.png", contact_sheet(result))
    report = result_dict(result, {"contact_sheet": str(png), "json": str(out / f"eval-{label}.json")})
    partial = out / f".eval-{label}.json.part"
    partial.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(partial, out / f"eval-{label}.json")
    return report
