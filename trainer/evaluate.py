"""Score TAEHV weights of any family on any folder of videos (or annotation JSON), read as validation
reads it: PSNR, SSIM, a temporal figure that exposes flicker, two baselines; optionally beside a second
set of weights (the same clip rule: one family, or its base and super decoders) and, given the
family's teacher, beside the teacher's own reconstruction and as a decoder of its latents.
`taehv-console eval` is its front end."""

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
    CUSTOM,
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
from trainer.teacher import (
    TeacherError,
    check_teacher_family,
    load_teacher,
    read_teacher_config,
    teacher_decoded_frames,
    teacher_geometry,
)
from trainer.teacher import encode as teacher_encode

# final/ and best/ hold the exported weights as <family>.safetensors (trainer.families.exported_files),
# and beside them, when the run kept an EMA, <family>_ema.safetensors: the weights its validation
# chose best/ by and its samples show. taehv's names, the ones runs before families wrote:
EXPORTED, EXPORTED_EMA = exported_files(DEFAULT_FAMILY)
CHECKPOINT_EMA = "weights_ema.safetensors"  # a checkpoint's step-<N>/ EMA weights
DEFAULT_FRAMES = 12  # rounded up to the family's frame quantum: taehv 12, LTX 16, H3 17


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


def _shapes_text(knobs: dict[str, object], wide: bool) -> str:
    def strides(key: str) -> tuple[int, ...]:
        return tuple(2 if b else 1 for b in knobs[key])  # type: ignore[attr-defined]

    return (
        f"latent_channels={knobs['latent_channels']}, patch_size={knobs['patch_size']}, time strides: "
        f"encoder {strides('encoder_time_downscale')}, decoder {strides('decoder_time_upscale')}, "
        f"{'super' if wide else 'base'} decoder"
    )


def infer_model_section(
    sd: dict[str, torch.Tensor],
    path: Path,
    meta: dict[str, str] | None = None,
    family: str | None = None,
    prefer: str | None = None,
) -> ModelSection:
    """The architecture of weights that come without their run.toml: `family` when given (eval's
    --family), else the family their metadata records, else the one their name says (TAEHV.from_file's
    order), else the one family their shapes fit. Shapes several families share (taehv, taew2_1 and
    taecvx) with nothing naming one are a WeightsError listing them, unless `prefer` is one of them
    (a --compare file is read as the primary's family); shapes no family has are scored as `custom`
    with their knobs, as a custom run exports them. A named family the shapes do not fit is an error
    saying what they fit. Spatial upscaling has no weights: the default."""
    knobs = shape_knobs(sd, path)
    wide = bool(knobs.pop("super_decoder"))
    fits = families_with_shapes(**knobs, super_decoder=wide)
    recorded = (meta or {}).get("family")
    named, said_by = (
        (family, "--family")
        if family
        else (recorded, "its metadata")
        if recorded
        else (family_from_name(path.name), "its name")
    )
    if named is not None and named != CUSTOM:
        if named not in FAMILIES:
            raise WeightsError(
                f"{path}: {said_by} names family {named!r}, unknown; known: {', '.join(FAMILIES)}"
            )
        if named not in fits:
            fit = (
                f"fit {', '.join(fits)}"
                if fits
                else "fit no family (--family custom scores them as they are)"
            )
            raise WeightsError(
                f"{path}: {said_by} says family {named}, but its tensors ({_shapes_text(knobs, wide)}) {fit}"
            )
        chosen = named
    elif named == CUSTOM or not fits:
        chosen = CUSTOM
    elif len(fits) == 1:
        chosen = fits[0]
    elif prefer in fits:
        chosen = str(prefer)
    else:
        raise WeightsError(
            f"{path}: cannot tell the family: neither its metadata nor its name names one, and its tensors "
            f"({_shapes_text(knobs, wide)}) fit several: {', '.join(fits)}; "
            f"{'' if prefer else 'pass --family NAME or '}rename the file to its family's name "
            f"(e.g. {fits[0]}{path.suffix})"
        )
    try:
        return ModelSection.model_validate({"family": chosen, **({} if chosen in FAMILIES else knobs)})
    except ValidationError as err:
        raise WeightsError(format_validation_error(err, str(path))) from None


def architecture(
    source: WeightsSource, family: str | None = None, prefer: str | None = None
) -> tuple[ModelSection, DataSection | None, str]:
    """The model's config (from the run's run.toml, else inferred from the weights: infer_model_section
    with `family` and `prefer`), the run's data section (None without a run) and a sentence saying
    where the config came from. A `family` other than the run's is an EvalError."""
    if source.run_dir is not None:
        cfg = load_config(source.run_dir / "run.toml")
        if family and family != cfg.model.family:
            raise EvalError(
                f"--family {family}: {source.path} belongs to run {source.run_dir}, whose run.toml says "
                f"model.family = {cfg.model.family}"
            )
        model = cfg.model.model_copy(update={"init_weights": "", "activation_checkpointing": False})
        return (
            model,
            cfg.data,
            f"family {model.family}; architecture and clip size from {source.run_dir / 'run.toml'}",
        )
    sd, meta = read_weights(source.path)
    model = infer_model_section(sd, source.path, meta, family, prefer)
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


def _first_frame_size(paths: list[Path], space_scale: int = 8) -> tuple[int, int] | None:
    """The first readable video's frame size, rounded down to multiples of the family's 8·p (at
    least one)."""
    s = space_scale
    for path in paths:
        size = _frame_size(path)
        if size is not None:
            return max(s, size[0] // s * s), max(s, size[1] // s * s)
    return None


def default_frames(rule: ClipRule) -> int:
    """Frames per clip without a run or --frames: DEFAULT_FRAMES rounded up to the family's frame
    quantum (taehv 12, LTX 16, H3 17)."""
    q = rule.frame_quantum
    return -(-DEFAULT_FRAMES // q) * q


def clip_section(
    paths: list[Path],
    run_data: DataSection | None,
    frames: int | None,
    size: tuple[int, int] | None,
    rule: ClipRule | None = None,
) -> DataSection:
    """How the clips are read: the run's data section (crop size, frame height, frame step) or,
    without a run, whole frames of the first video (rounded down to multiples of the family's 8·p)
    and default_frames; --frames and --size override either. One clip a video, its first frames,
    centred (validation's way). Checked against the family's clip rule: a length it cannot encode
    exactly, or a crop that is not a multiple of its 8·p, is an EvalError saying what works."""
    rule = rule or clip_rule(DEFAULT_FAMILY)
    base: dict[str, object] = (
        run_data.model_dump() if run_data is not None else {"frames": default_frames(rule)}
    )
    if run_data is None and size is None:
        size = _first_frame_size(paths, rule.space_scale)
    # --data is read on its own terms: an annotation JSON's paths from its own folder
    base.update(source="", root="", max_skip_per_item=1, val_fraction=0.0)
    if frames is not None:
        base["frames"] = frames
    if size is not None:
        base["height"], base["width"] = size
    try:
        return DataSection.model_validate(base, context={"clip_rule": rule})
    except ValidationError as err:
        raise EvalError(format_validation_error(err, f"--frames/--size (family {rule.family})")) from None


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
    family: str = DEFAULT_FAMILY  # the weights' family (or custom)
    clips: list[Figures] = field(default_factory=list)
    recon: list[torch.Tensor] = field(default_factory=list)  # the first SHEET_CLIPS', on the CPU
    teacher_vs_teacher: list[float] = field(default_factory=list)  # decode of teacher latents vs teacher's
    teacher_vs_input: list[float] = field(default_factory=list)  # the same decode vs the input

    @property
    def overall(self) -> Figures:
        return Figures.mean(self.clips)


@dataclass(frozen=True)
class TeacherInfo:
    path: str  # the --teacher directory
    class_name: str  # its diffusers class (config.json's _class_name)


@dataclass
class EvalResult:
    data: str
    section: DataSection
    clips: list[EvalClip]
    skipped: list[tuple[str, str]]
    scored_frames: int  # the decoded frames that stand for input frames [0, n): T - 3 (LTX T - 7, H3 T - 12)
    models: list[ModelScore]
    baselines: list[dict[str, Figures]]
    # with --teacher: the teacher's own encode + decode vs the input, on the frames the students are scored on
    teacher_reference: list[Figures]
    streaming: bool
    device: str
    teacher: TeacherInfo | None = None

    @property
    def family(self) -> str:
        return self.models[0].family


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


def decoded_frames(model: TAEHV, frames: int) -> int:
    """How many frames decode(encode(x)) gives for a `frames`-frame clip (a length the family takes):
    the frames [0, n) that the figures score. taehv T - 3, LTX T - 7, H3 T - 12, CogVideoX at an even
    number of latents T."""
    t = -(-frames // model.frame_quantum) * model.frame_quantum
    if model.chunks is not None:
        c = model.chunks
        k = t // c.frames * (c.frames + c.lead) // model.t_downscale - c.dropped_latents
    else:
        k = t // model.t_downscale
    kept = model.kept_frames(k)
    return len(range(model.t_upscale * k)[kept]) if isinstance(kept, slice) else len(kept)


def _rule_text(rule: ClipRule) -> str:
    return f"clips of a multiple of {rule.frame_quantum} frames, crops a multiple of {rule.space_scale} px"


def _check_comparable(
    a: tuple[WeightsSource, ModelSection, TAEHV],
    b: tuple[WeightsSource, ModelSection, TAEHV],
    frames: int,
) -> None:
    """Two sets of weights are scored on the same clips against the same frames: their families take
    the same clip rule (one family, its base and super decoders, or families of one shape such as
    taehv and taew2_1) and decode the same frames of this clip. Else an EvalError saying which."""
    (sa, ca, ma), (sb, cb, mb) = a, b
    ra = clip_rule(ca.family, ca.encoder_time_downscale, ca.patch_size)
    rb = clip_rule(cb.family, cb.encoder_time_downscale, cb.patch_size)
    if (ra.frame_quantum, ra.space_scale) != (rb.frame_quantum, rb.space_scale):
        raise EvalError(
            f"--compare {sb.path}: family {cb.family} takes {_rule_text(rb)}; {sa.path} (family {ca.family}) "
            f"takes {_rule_text(ra)}: no clip is read the same way by both. Compare weights of one family "
            "(or its base and super decoders), or score each on its own"
        )
    na, nb = decoded_frames(ma, frames), decoded_frames(mb, frames)
    if na != nb:
        q = ra.frame_quantum
        agree = [n for n in range(q, 16 * q + 1, q) if decoded_frames(ma, n) == decoded_frames(mb, n)]
        hint = f"; they agree at --frames {' or '.join(map(str, sorted(agree, key=lambda n: abs(n - frames))[:2]))}"
        raise EvalError(
            f"--compare {sb.path}: of a {frames}-frame clip, family {cb.family} decodes {nb} frames and "
            f"{ca.family} ({sa.path.name}) {na}: their figures would score different frames"
            + (hint if agree else "")
        )


def _teacher_where(path: str) -> str:
    return f"--teacher = {str(Path(path).expanduser())!r}"


def _load_teacher_for(teacher: str, models: list[tuple[WeightsSource, ModelSection, TAEHV]]) -> Any:
    """The teacher (TeacherError for a missing or unloadable one, or one whose latents are not every
    scored family's, naming the family that fits it)."""
    _s, cfg, first = models[0]
    loaded = load_teacher(
        teacher,
        latent_channels=cfg.latent_channels,
        where="--teacher",
        family=cfg.family,
        space_scale=8 * cfg.patch_size,
        time_scale=first.t_downscale,
    )
    geometry = teacher_geometry(read_teacher_config(teacher, "", "--teacher"))
    for source, other, model in models[1:]:
        check_teacher_family(
            geometry,
            other.family,
            other.latent_channels,
            8 * other.patch_size,
            model.t_downscale,
            f"{_teacher_where(teacher)} (for --compare {source.path})",
        )
    return loaded


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
    family: str | None = None,
) -> EvalResult:
    """Score `primary` (and `compare`, on the same clips: the same clip rule and decoded frames) on
    `data`; with `teacher`, also the teacher's own reconstruction and each model as a decoder of its
    latents. `family` is --family: the primary weights' family where their file does not say it."""
    dev = eval_device(device)
    model_cfg, run_data, note = architecture(primary, family)
    models = [(primary, model_cfg, note, load_model(primary, model_cfg, dev))]
    if compare is not None:
        cfg_b, _data_b, note_b = architecture(compare, prefer=model_cfg.family)
        try:
            b = load_model(compare, cfg_b, dev)
        except WeightsError as err:
            raise EvalError(
                f"--compare {compare.path}: its weights do not match {primary.path}'s: {err}"
            ) from None
        models.append((compare, cfg_b, note_b, b))
    paths = find_videos(data)
    rule = clip_rule(model_cfg.family, model_cfg.encoder_time_downscale, model_cfg.patch_size)
    section = clip_section(paths, run_data, frames, size, rule)
    loaded = [(s, c, m) for s, c, _n, m in models]
    if compare is not None:
        _check_comparable(loaded[0], loaded[1], section.frames)
    teacher_model, info = None, None
    if teacher:
        teacher_model = _load_teacher_for(teacher, loaded).to(dev)
        info = TeacherInfo(str(Path(teacher).expanduser()), type(teacher_model).__name__)
    progress(
        f"scoring {len(paths)} video(s) with family {model_cfg.family} weights: clips of {section.frames} "
        f"frames at {section.height}x{section.width} on {dev}"
    )
    result = EvalResult(
        data,
        section,
        [],
        [],
        decoded_frames(loaded[0][2], section.frames),
        [ModelScore(s, n, c.family) for s, c, n, _m in models],
        [],
        [],
        streaming,
        str(dev),
        info,
    )
    nets = [(s, m) for s, _c, _n, m in models]
    with torch.no_grad():
        for path, video in iter_clips(paths, section, result.skipped):
            if limit and len(result.clips) >= limit:
                break
            x = video.to(dev)[None].float() / 255
            keep = len(result.clips) < SHEET_CLIPS
            result.clips.append(EvalClip(path, x[0].cpu() if keep else None))
            _score_clip(x, nets, result, keep)
            if teacher_model is not None:
                assert teacher is not None
                _score_teacher(teacher_model, x, nets, result, model_cfg.family, teacher)
            progress(f"  {path.name}: " + "  ".join(f"{m.clips[-1].psnr:.2f} dB" for m in result.models))
    if not result.clips:
        reasons = "; ".join(f"{p}: {r}" for p, r in result.skipped[:3])
        raise EvalError(f"{data}: no readable video ({len(result.skipped)} tried: {reasons})")
    return result


def _score_clip(
    x: torch.Tensor, models: list[tuple[WeightsSource, TAEHV]], result: EvalResult, keep: bool
) -> None:
    target = x
    for (_s, model), out in zip(models, result.models):
        _z, y = stream_forward(model, x) if result.streaming else model(x)
        target = reconstruction_target(x, y.shape[1])
        out.clips.append(figures(target[0], y[0]))
        if keep:
            out.recon.append(y[0].cpu())
    result.scored_frames = target.shape[1]
    result.baselines.append(baselines(target[0]))


def _score_teacher(
    teacher: Any,
    x: torch.Tensor,
    models: list[tuple[WeightsSource, TAEHV]],
    result: EvalResult,
    family: str,
    where: str,
) -> None:
    """The teacher's own reconstruction (its encode of the family's frames, teacher_frames, then its
    decode) against the input frames the students are scored on, [0, scored_frames); and TAEHV as the
    teacher's decoder: its decode of the teacher's latents against the teacher's own decode and the
    input, on the same frames."""
    n = result.scored_frames
    try:
        latents = teacher_encode(teacher, x, family, next(iter(models))[1].t_downscale)
        own = teacher_decoded_frames(teacher, teacher.decode(latents.permute(0, 2, 1, 3, 4)).sample)
    except Exception as err:  # noqa: BLE001 - a teacher that loads but cannot code this clip
        c = result.section
        raise TeacherError(
            f"{_teacher_where(where)}: {type(teacher).__name__} cannot encode and decode a {c.frames}-frame "
            f"{c.height}x{c.width} clip ({type(err).__name__}: {err}); try more --frames or a larger --size"
        ) from None
    if own.shape[1] < n:
        raise TeacherError(
            f"{_teacher_where(where)}: its decode of a {x.shape[1]}-frame clip has {own.shape[1]} frames, "
            f"the {family} student's {n}: they stand for different input frames"
        )
    own, truth = own[:, :n], x[:, :n]
    result.teacher_reference.append(figures(truth[0], own[0]))
    for (_s, model), out in zip(models, result.models):
        z = latents.to(next(model.parameters()).dtype)
        y = (stream_decode(model, z) if result.streaming else model.decode(z))[:, :n]
        out.teacher_vs_teacher.append(_psnr(y, own))
        out.teacher_vs_input.append(_psnr(y, truth))
