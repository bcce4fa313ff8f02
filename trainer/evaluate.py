"""Score TAEHV weights on any folder of videos (or annotation JSON), read as validation reads it:
PSNR, SSIM, a temporal figure that exposes flicker, two baselines; optionally beside a second set
of weights and as a decoder of the teacher's latents. `taehv-console eval` is its front end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from trainer.checkpoint import WEIGHTS
from trainer.config import DataSection, ModelSection, format_validation_error, load_config
from trainer.data import DataSourceError, VideoClipDataset, find_videos, read_frames
from trainer.errors import EvalError
from trainer.families import (
    DEFAULT_FAMILY,
    FAMILIES,
    ClipRule,
    all_exported_files,
    clip_rule,
    exported_files,
    families_with_shapes,
    family_from_name,
)
from trainer.metrics import psnr_from_mse, ssim_per_frame
from trainer.model import (
    TAEHV,
    WeightsError,
    build_model,
    load_weights,
    read_weights,
    reconstruction_target,
    shape_knobs,
)
from trainer.streaming import stream_decode, stream_forward
from trainer.teacher import encode as teacher_encode
from trainer.teacher import load_teacher

# final/ and best/ hold the exported weights as <family>.safetensors (trainer.families.exported_files),
# and beside them, when the run kept an EMA, <family>_ema.safetensors: the weights its validation
# chose best/ by and its samples show. taehv's names, the ones runs before families wrote:
EXPORTED, EXPORTED_EMA = exported_files(DEFAULT_FAMILY)
CHECKPOINT_EMA = "weights_ema.safetensors"  # a checkpoint's step-<N>/ EMA weights
DEFAULT_FRAMES = 12


@dataclass(frozen=True)
class WeightsSource:
    path: Path  # the weights file
    label: str  # final, best, step-<N>, or the file's stem
    run_dir: Path | None  # the run it belongs to (its run.toml gives the architecture and clip size)


def _run_above(path: Path) -> Path | None:
    """The run directory holding a weights file: RUN/final/x, RUN/best/x, RUN/checkpoints/step-N/x."""
    for parent in list(path.parents)[:3]:
        if (parent / "run.toml").is_file():
            return parent
    return None


def resolve_weights(target: str | Path, best: bool = False, ema: bool = True) -> WeightsSource:
    """What WEIGHTS|RUN names: a run directory (or its run.toml) scores final/, best/ with `best`;
    final/, best/ or a checkpoint's step-<N>/ their weights; any other path is a weights file.
    Where a run kept an EMA of its weights, a folder's EMA weights are scored unless `ema` is
    False: they are what the run's validation chose best/ by, and what its samples show."""
    p = Path(target).expanduser()
    if p.name == "run.toml" and p.is_file():
        p = p.parent
    if p.is_dir() and (p / "run.toml").is_file():
        sub = "best" if best else "final"
        exported, exported_ema = exported_files(load_config(p / "run.toml").model.family)
        weights = p / sub / exported
        if not weights.is_file():
            other = "final" if best else "best"
            hint = f"; {p / other / exported} exists (use {'no ' if best else ''}--best)"
            hint = hint if (p / other / exported).is_file() else "; the run has exported no weights yet"
            raise EvalError(f"{weights}: no {sub} weights in run {p}{hint}")
        if ema and (p / sub / exported_ema).is_file():
            return WeightsSource(p / sub / exported_ema, f"{sub}-ema", p)
        return WeightsSource(weights, sub, p)
    if best:
        raise EvalError(f"{p}: --best needs a run directory (one holding run.toml)")
    if p.is_dir():
        emas = (*all_exported_files()[: len(FAMILIES)], CHECKPOINT_EMA)
        plain = (*all_exported_files()[len(FAMILIES) :], WEIGHTS)
        for name in (*emas, *plain) if ema else plain:
            if (p / name).is_file():
                label = f"{p.name}-ema" if name in emas else p.name
                return WeightsSource(p / name, label, _run_above(p / name))
        raise EvalError(
            f"{p}: no weights here (expected a run directory, its final/ or best/, a checkpoint "
            "step-<N>/, or a .safetensors / .pth file)"
        )
    if not p.is_file():
        raise EvalError(f"{p}: no such weights file or run directory")
    in_run = _run_above(p)
    return WeightsSource(p, p.parent.name if in_run else p.stem, in_run)


def infer_model_section(
    sd: dict[str, torch.Tensor], path: Path, meta: dict[str, str] | None = None
) -> ModelSection:
    """The architecture of weights that come without their run.toml: the family their metadata or
    name records (TAEHV.from_file's order), else the first family their shapes fit (the author's
    default, taehv, among the shapes several share), else their knobs as `custom`. Spatial
    upscaling has no weights: the default."""
    knobs = shape_knobs(sd, path)
    wide = knobs.pop("super_decoder")
    named = (meta or {}).get("family") or family_from_name(path.name)
    fits = families_with_shapes(**knobs, super_decoder=wide)
    family = named if named in fits else (fits[0] if fits else "custom")
    try:
        return ModelSection.model_validate({"family": family, **({} if family in FAMILIES else knobs)})
    except ValidationError as err:
        raise WeightsError(format_validation_error(err, str(path))) from None


def architecture(source: WeightsSource) -> tuple[ModelSection, DataSection | None, str]:
    """The model's config (from the run's run.toml, else inferred from the weights), the run's data
    section (None without a run) and a sentence saying where the config came from."""
    if source.run_dir is not None:
        cfg = load_config(source.run_dir / "run.toml")
        model = cfg.model.model_copy(update={"init_weights": "", "activation_checkpointing": False})
        return model, cfg.data, f"architecture and clip size from {source.run_dir / 'run.toml'}"
    sd, meta = read_weights(source.path)
    model = infer_model_section(sd, source.path, meta)
    note = (
        f"no run.toml: architecture inferred from {source.path.name} (family {model.family}, latent_channels="
        f"{model.latent_channels}, patch_size={model.patch_size}, time strides: encoder "
        f"{tuple(2 if b else 1 for b in model.encoder_time_downscale)}, decoder "
        f"{tuple(2 if b else 1 for b in model.decoder_time_upscale)})"
    )
    return model, None, note


def load_model(source: WeightsSource, model_cfg: ModelSection, device: torch.device) -> TAEHV:
    model = build_model(model_cfg.model_copy(update={"channels_last": False, "init_weights": ""}))
    load_weights(model, source.path, strict=True)  # WeightsError names the file and the keys
    return model.to(device).eval()


# ---- figures ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    psnr: float  # dB, of the clip's mean squared error (as validation computes it)
    ssim: float  # mean over frames
    temporal_mse: float  # MSE of frame-to-frame differences: (y[t+1]-y[t]) vs (x[t+1]-x[t])
    temporal_psnr: float  # the same in dB; low where the reconstruction flickers

    @staticmethod
    def mean(items: list[Figures]) -> Figures:
        def avg(name: str) -> float:
            values = [getattr(f, name) for f in items]
            return sum(values) / len(values) if values else float("nan")

        return Figures(avg("psnr"), avg("ssim"), avg("temporal_mse"), avg("temporal_psnr"))


def figures(x: torch.Tensor, y: torch.Tensor) -> Figures:
    """The figures of a reconstruction y of frames x (both T×3×H×W in [0, 1])."""
    if x.shape != y.shape or x.dim() != 4:
        raise ValueError(f"figures: shapes {tuple(x.shape)} and {tuple(y.shape)} must be the same T×3×H×W")
    x, y = x.float(), y.float()
    mse = torch.mean((y - x) ** 2).item()
    ssim = ssim_per_frame(y, x).mean().item()
    if x.shape[0] < 2:
        tmse = float("nan")
    else:
        tmse = torch.mean(((y[1:] - y[:-1]) - (x[1:] - x[:-1])) ** 2).item()
    return Figures(psnr_from_mse(mse), ssim, tmse, psnr_from_mse(tmse))


def baselines(x: torch.Tensor) -> dict[str, Figures]:
    """What a model that learned nothing scores: a mid-grey output, and each clip's mean colour."""
    grey = torch.full_like(x, 0.5)
    mean_colour = x.float().mean(dim=(0, 2, 3), keepdim=True).expand_as(x)
    return {"mid_grey": figures(x, grey), "mean_colour": figures(x, mean_colour)}


# ---- the clips ----------------------------------------------------------------------------------


SHEET_CLIPS = 8  # clips whose frames are kept for the contact sheet


@dataclass
class EvalClip:
    source: Path
    video: torch.Tensor | None  # T×3×H×W in [0, 1] on the CPU; kept for the first SHEET_CLIPS only


def _frame_size(path: Path) -> tuple[int, int] | None:
    try:
        h, w = read_frames(path, [0], allow_seek=False).shape[1:3]
    except Exception:  # noqa: BLE001 - an unreadable video is reported when the clips are read
        return None
    return h, w


def _first_frame_size(paths: list[Path]) -> tuple[int, int] | None:
    """The first readable video's frame size, rounded down to multiples of 8."""
    for path in paths:
        size = _frame_size(path)
        if size is not None:
            return max(8, size[0] // 8 * 8), max(8, size[1] // 8 * 8)
    return None


def clip_section(
    paths: list[Path],
    run_data: DataSection | None,
    frames: int | None,
    size: tuple[int, int] | None,
    rule: ClipRule | None = None,
) -> DataSection:
    """How the clips are read: the run's data section (crop size, frame height, frame step) or,
    without a run, whole frames of the first video (rounded down to multiples of 8); --frames and
    --size override either. One clip a video, its first frames, centred (validation's way)."""
    base: dict[str, object] = run_data.model_dump() if run_data is not None else {"frames": DEFAULT_FRAMES}
    if run_data is None and size is None:
        size = _first_frame_size(paths)
    # --data is read on its own terms: an annotation JSON's paths from its own folder
    base.update(source="", root="", max_skip_per_item=1, val_fraction=0.0)
    if frames is not None:
        base["frames"] = frames
    if size is not None:
        base["height"], base["width"] = size
    try:
        # checked against the weights' family's clip rule (a clip it cannot encode exactly is refused)
        return DataSection.model_validate(base, context={"clip_rule": rule or clip_rule(DEFAULT_FAMILY)})
    except ValidationError as err:
        raise EvalError(format_validation_error(err, "--frames/--size")) from None


def iter_clips(
    paths: list[Path], cfg: DataSection, skipped: list[tuple[str, str]]
) -> Iterator[tuple[Path, torch.Tensor]]:
    """One clip (uint8 T×3×H×W) from each video that gives one, read when asked for; (path,
    reason) of each that does not goes to `skipped`."""
    dataset = VideoClipDataset(paths, cfg, train=False)
    for i, path in enumerate(paths):
        try:
            item = dataset[i]
        except DataSourceError:
            skipped.append((str(path), dataset.bad.get(str(path), "unreadable")))
            continue
        yield path, item["video"]


# ---- scoring ------------------------------------------------------------------------------------


@dataclass
class ModelScore:
    source: WeightsSource
    note: str
    clips: list[Figures] = field(default_factory=list)
    recon: list[torch.Tensor] = field(default_factory=list)  # the first SHEET_CLIPS', on the CPU
    teacher_vs_teacher: list[float] = field(default_factory=list)  # decode of teacher latents vs teacher's
    teacher_vs_input: list[float] = field(default_factory=list)  # the same decode vs the input

    @property
    def overall(self) -> Figures:
        return Figures.mean(self.clips)


@dataclass
class EvalResult:
    data: str
    section: DataSection
    clips: list[EvalClip]
    skipped: list[tuple[str, str]]
    scored_frames: int  # T = 4k frames decode to 4k - 3
    models: list[ModelScore]
    baselines: list[dict[str, Figures]]
    teacher_reference: list[float]  # the teacher's own reconstruction vs the input (with --teacher)
    streaming: bool
    device: str


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return psnr_from_mse(torch.mean((a.float() - b.float()) ** 2).item())


def eval_device(device: str | None) -> torch.device:
    """The device to score on: `device` (checked here, so `cuda:7` on a CPU build or a machine with
    two GPUs is an EvalError naming it, not torch's AssertionError), else cuda when present."""
    if not device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise EvalError(f"--device {device!r}: not a torch device ({err})") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (dev.index or 0) >= count:
            raise EvalError(f"--device {device}: this machine has {count} CUDA device(s) torch can use")
    elif dev.type != "cpu":
        raise EvalError(f"--device {device}: eval runs on cpu or cuda[:N]")
    return dev


def score(
    primary: WeightsSource,
    data: str,
    compare: WeightsSource | None = None,
    teacher: str | None = None,
    frames: int | None = None,
    size: tuple[int, int] | None = None,
    streaming: bool = False,
    limit: int = 0,
    device: str | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> EvalResult:
    """Score `primary` (and `compare`, on the same clips with the same architecture) on `data`."""
    dev = eval_device(device)
    model_cfg, run_data, note = architecture(primary)
    models = [(primary, note, load_model(primary, model_cfg, dev))]
    if compare is not None:
        try:
            b = load_model(compare, model_cfg, dev)
        except WeightsError as err:
            raise EvalError(
                f"--compare {compare.path}: its weights do not match {primary.path}'s: {err}"
            ) from None
        models.append((compare, f"the architecture of {primary.path.name}", b))
    paths = find_videos(data)
    rule = clip_rule(model_cfg.family, model_cfg.encoder_time_downscale, model_cfg.patch_size)
    section = clip_section(paths, run_data, frames, size, rule)
    progress(
        f"scoring {len(paths)} video(s): clips of {section.frames} frames at {section.height}x{section.width} on {dev}"
    )
    teacher_model = None
    if teacher:
        teacher_model = load_teacher(
            teacher, latent_channels=model_cfg.latent_channels, where="--teacher", family=model_cfg.family
        ).to(dev)
    result = EvalResult(
        data, section, [], [], 0, [ModelScore(s, n) for s, n, _m in models], [], [], streaming, str(dev)
    )
    with torch.no_grad():
        for path, video in iter_clips(paths, section, result.skipped):
            if limit and len(result.clips) >= limit:
                break
            x = video.to(dev)[None].float() / 255
            keep = len(result.clips) < SHEET_CLIPS
            result.clips.append(EvalClip(path, x[0].cpu() if keep else None))
            _score_clip(x, models, result, keep)
            if teacher_model is not None:
                _score_teacher_latents(teacher_model, x, models, result, model_cfg.family)
            progress(f"  {path.name}: " + "  ".join(f"{m.clips[-1].psnr:.2f} dB" for m in result.models))
    if not result.clips:
        reasons = "; ".join(f"{p}: {r}" for p, r in result.skipped[:3])
        raise EvalError(f"{data}: no readable video ({len(result.skipped)} tried: {reasons})")
    return result


def _score_clip(
    x: torch.Tensor, models: list[tuple[WeightsSource, str, TAEHV]], result: EvalResult, keep: bool
) -> None:
    target = x
    for (_s, _n, model), out in zip(models, result.models):
        _z, y = stream_forward(model, x) if result.streaming else model(x)
        target = reconstruction_target(x, y.shape[1])
        out.clips.append(figures(target[0], y[0]))
        if keep:
            out.recon.append(y[0].cpu())
    result.scored_frames = target.shape[1]
    result.baselines.append(baselines(target[0]))


def _score_teacher_latents(
    teacher: Any,
    x: torch.Tensor,
    models: list[tuple[WeightsSource, str, TAEHV]],
    result: EvalResult,
    family: str = "taehv",
) -> None:
    """TAEHV as the teacher's decoder: its decode of the teacher's latents against the teacher's own
    decode and against the input frames they stand for (the first T - 3)."""
    latents = teacher_encode(teacher, x, family)
    own = teacher.decode(latents.permute(0, 2, 1, 3, 4)).sample
    decoded = own.permute(0, 2, 1, 3, 4).float().add(1).div(2).clamp(0, 1)
    truth = x[:, : decoded.shape[1]]
    result.teacher_reference.append(_psnr(decoded, truth))
    for (_s, _n, model), out in zip(models, result.models):
        z = latents.to(next(model.parameters()).dtype)
        y = stream_decode(model, z) if result.streaming else model.decode(z)
        out.teacher_vs_teacher.append(_psnr(y, decoded))
        out.teacher_vs_input.append(_psnr(y, truth))
