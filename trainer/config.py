"""The resolved training configuration (`run.toml`): every knob a preset sets, validated.

The trainer reads this schema; the console's presets (taehv_console.core.plan) produce it. One
schema for both sides means a value a preset sets can never silently miss the trainer.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trainer.errors import TeacherError
from trainer.families import CUSTOM, DEFAULT_FAMILY, FAMILIES, ClipRule, clip_rule, families_with_shapes
from trainer.teacher_geometry import AUTO, auto_model, geometry_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class _Section(BaseModel):
    # Unknown keys are errors: a misspelt knob must never be ignored silently.
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSection(_Section):
    name: str = "taehv"
    preset: str = "custom"
    seed: int = Field(1234, ge=0)


class TopologySection(_Section):
    nodes: int = Field(1, ge=1, description="machines taking part")
    gpus_per_node: int = Field(1, ge=1, description="training processes per machine (GPUs, or CPU processes)")
    device: Literal["cuda", "cpu"] = "cuda"
    gpu_memory_gb: float = Field(80.0, gt=0)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


SHAPE_KNOBS = ("latent_channels", "patch_size", "encoder_time_downscale", "decoder_time_upscale")


def _as_tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


def _toml(value: object) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


class ModelSection(_Section):
    family: str = Field(
        DEFAULT_FAMILY,
        description=f"the TAE family to train ({', '.join(FAMILIES)}); it sets every shape knob below. "
        f"'{CUSTOM}': shapes of no family, from the knobs as written (exported under taehv's name). "
        f"'{AUTO}': derived from loss.teacher's config.json when the config is read (the published family "
        f"its VAE serves, else '{CUSTOM}' shapes of its latents), so a written run.toml names the result",
    )
    latent_channels: int = Field(16, ge=1)
    patch_size: int = Field(1, ge=1, le=8)
    encoder_time_downscale: tuple[bool, bool, bool] = (True, True, False)
    decoder_time_upscale: tuple[bool, bool, bool] = (False, True, True)
    decoder_space_upscale: tuple[bool, bool, bool] = (True, True, True)
    init_weights: str = Field("", description="a .pth or .safetensors file to start from ('' = random)")
    init_strict: bool = True
    activation_checkpointing: bool = False
    channels_last: bool = False
    compile: bool = False
    compile_mode: Literal["default", "max-autotune-no-cudagraphs"] = Field(
        "default",
        description="torch.compile's mode under model.compile: 'max-autotune-no-cudagraphs' times "
        "Triton convolution and matmul templates against cuDNN's kernels and keeps the faster, "
        "which lets a convolution's ReLU fuse into it (compiling takes minutes longer). No CUDA-graph "
        "modes: untried under DeepSpeed, and with steps of ~200 ms kernel launches are not what limits",
    )

    @model_validator(mode="before")
    @classmethod
    def _family_sets_the_shapes(cls, data: object) -> object:
        """Fill the shape knobs from the family; a knob given that contradicts it is an error naming
        both. A `[model]` written before families existed (no `family`) takes the first family whose
        shapes its knobs match, so an old run.toml reads as it always did (taehv by default)."""
        if not isinstance(data, dict):
            return data
        given = {k: _as_tuple(data[k]) for k in SHAPE_KNOBS if k in data}
        name = data.get("family")
        if name is None or name == CUSTOM:
            # every knob, the unset ones at their (taehv) defaults: the family they spell, if any
            knobs = {**FAMILIES[DEFAULT_FAMILY].shape_knobs(), **given}
            matching = families_with_shapes(**knobs, super_decoder=False)
            if name is None and matching:
                return {**data, "family": matching[0]}
            return {**data, "family": CUSTOM}  # shapes of no family: the knobs stand as written
        if name == AUTO:
            raise ValueError(
                "model.family = auto is resolved from loss.teacher when the whole config is read "
                "(config_from_dict); this [model] was read alone"
            )
        if not isinstance(name, str) or name not in FAMILIES:
            known = ", ".join([*FAMILIES, CUSTOM, AUTO])
            raise ValueError(f"model.family: unknown family {name!r}; known: {known}")
        own = FAMILIES[name].shape_knobs()
        wrong = [k for k, v in given.items() if v != own[k]]
        if wrong:
            shown = "; ".join(
                f"model.{k} = {_toml(given[k])} contradicts model.family = {name}, which has {_toml(own[k])}"
                for k in wrong
            )
            fits = families_with_shapes(**{**own, **given})
            hint = f"; the families with those shapes: {', '.join(fits)}" if fits else ""
            raise ValueError(f"{shown} (leave the knob out: the family sets it{hint})")
        return {**data, **own}

    @model_validator(mode="after")
    def _time_scales_agree(self) -> ModelSection:
        if sum(self.encoder_time_downscale) != sum(self.decoder_time_upscale):
            raise ValueError(
                "encoder_time_downscale and decoder_time_upscale must scale time by the same factor "
                f"(got {self.encoder_time_downscale} vs {self.decoder_time_upscale})"
            )
        return self


class DataSection(_Section):
    source: str = Field("", description="a directory of videos (recursive) or an annotation JSON")
    root: str = Field("", description="root for the annotation JSON's relative paths ('' = its folder)")
    frames: int = Field(
        12,
        ge=4,
        description="T, frames per clip: a multiple of the family's time scale (4; LTX 8), H3 of 17",
    )
    height: int = Field(480, ge=8, description="training crop height: the clips the model sees")
    width: int = Field(720, ge=8, description="training crop width")
    frame_height: int = Field(
        0,
        ge=0,
        description="frames are scaled down to this height (never up) and the height x width crop is taken "
        "from them; 0 = the crop covers the frame's largest region of its aspect ratio (a resize-crop)",
    )
    min_delta: int = Field(1, ge=1, description="smallest frame step when sampling a clip")
    max_delta: int = Field(2, ge=1, description="largest frame step when sampling a clip")
    min_crop_scale: float = Field(
        0.6, gt=0, le=1, description="training crops zoom in by up to 1/this, down to the source's own pixels"
    )
    flip: bool = True
    color_jitter: float = Field(0.05, ge=0, le=0.5)
    val_fraction: float = Field(0.1, ge=0, lt=1)
    val_max_clips: int = Field(64, ge=0)
    num_workers: int = Field(2, ge=0)
    prefetch_factor: int = Field(2, ge=1)
    max_skip_per_item: int = Field(8, ge=1, description="bad videos tried in a row before giving up")
    crops_per_clip: int = Field(
        1,
        ge=1,
        le=256,
        description="training crops cut from each decoded clip, each with its own window, flip and jitter: "
        "decoding is the loader's cost, so small crops (the crop recipe) share it; a multiple of it "
        "must divide optim.batch_per_gpu",
    )

    # The clip rule is the family's (model.family): config_from_dict passes it in the validation context,
    # so a bad length is reported at data.frames beside every other error; TrainConfig checks it
    # again for a config validated without one (a DataSection alone is checked only for what it is).
    @field_validator("frames")
    @classmethod
    def _family_encodes_the_clip(cls, v: int, info: ValidationInfo) -> int:
        rule = (info.context or {}).get("clip_rule")
        problem = rule.frames_problem(v) if isinstance(rule, ClipRule) else None
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("height", "width")
    @classmethod
    def _family_encodes_the_crop(cls, v: int, info: ValidationInfo) -> int:
        rule = (info.context or {}).get("clip_rule")
        problem = rule.size_problem(v) if isinstance(rule, ClipRule) else None
        if problem:
            raise ValueError(problem)
        return v

    @model_validator(mode="after")
    def _deltas_ordered(self) -> DataSection:
        if self.max_delta < self.min_delta:
            raise ValueError(f"max_delta ({self.max_delta}) is below min_delta ({self.min_delta})")
        if 0 < self.frame_height < self.height:
            raise ValueError(
                f"frame_height ({self.frame_height}) is below the crop height ({self.height}): "
                "a crop cannot be taller than the frame it is cut from (0 = resize-crops)"
            )
        return self


class OptimSection(_Section):
    batch_per_gpu: int = Field(1, ge=1)
    grad_accum: int = Field(1, ge=1)
    lr: float = Field(1e-4, gt=0, le=1)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(1e-2, ge=0)
    warmup_steps: int = Field(100, ge=0)
    schedule: Literal["cosine", "constant", "linear"] = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    max_steps: int = Field(1000, ge=1, description="optimizer steps")
    grad_clip: float = Field(1.0, ge=0, description="0 = no clipping")
    ema_decay: float = Field(0.0, ge=0, lt=1, description="0 = no EMA of the weights")

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError(f"each beta must be in [0, 1), got {v}")
        return v


class LossSection(_Section):
    recon_weight: float = Field(1.0, ge=0)
    teacher: str = Field(
        "",
        description="a local diffusers VAE directory of model.family's teacher class, read from its "
        "config.json ('' = none)",
    )
    teacher_subfolder: str = ""
    teacher_cache: str = Field(
        "",
        description="a latent cache written by `taehv-train cache-latents` ('' = run the teacher online); "
        "when set, training reads it and never loads the teacher",
    )
    distill_encoder_weight: float = Field(1.0, ge=0)
    decoder_on_teacher_latents: bool = False

    @property
    def distilling(self) -> bool:
        return bool(self.teacher or self.teacher_cache)


class AdversarialSection(_Section):
    """The decoder's adversarial term (the author's notebook): a conditional patch discriminator over
    groups of 3 decoded frames, trained beside the autoencoder with its own optimizer."""

    weight: float = Field(0.0, ge=0, description="the generator's adversarial loss weight (0 = off)")
    lr: float = Field(2e-4, gt=0, le=1, description="the discriminator's AdamW learning rate")
    betas: tuple[float, float] = (0.5, 0.99)
    width: int = Field(32, ge=4, description="channels of the discriminator's first layer")
    replay: int = Field(64, ge=0, description="generated frame groups kept to show the discriminator again")


class DeepSpeedSection(_Section):
    zero_stage: Literal[0, 1, 2, 3] = 2
    mixed_precision: Literal["auto", "bf16", "fp16", "no"] = Field(
        "auto", description="auto = bf16 on GPU, fp32 on CPU"
    )
    # Defaults sized for this model on one node (taehv_console/core/plan/zero.py): one bucket of 2e7
    # elements holds the whole 11.3M-element gradient, so overlap_comm would overlap nothing and only
    # add a second bucket buffer and a device synchronisation per micro-batch. Across nodes the
    # planner sizes buckets of a few million elements with overlap on.
    allgather_bucket_size: int = Field(20_000_000, ge=1, description="elements per weight all-gather")
    reduce_bucket_size: int = Field(20_000_000, ge=1, description="elements per gradient reduction bucket")
    overlap_comm: bool = Field(
        False, description="reduce buckets while backward runs (needs several buckets)"
    )
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    communication_data_type: Literal["auto", "fp32", "fp16", "bf16"] = "auto"
    stage3_max_live_parameters: int = Field(1_000_000_000, ge=1)
    stage3_max_reuse_distance: int = Field(1_000_000_000, ge=0)
    stage3_prefetch_bucket_size: int = Field(200_000_000, ge=1)
    stage3_param_persistence_threshold: int = Field(100_000, ge=0)


class ScheduleSection(_Section):
    log_every: int = Field(10, ge=1, description="steps between TensorBoard/non-rank-0 event writes")
    val_every: int = Field(500, ge=1)
    val_at_start: bool = Field(
        False,
        description="validate the untrained model before step 1: the curve's baseline, and a broken "
        "validation set fails in seconds instead of at the first val_every",
    )
    checkpoint_every: int = Field(1000, ge=1)
    keep_checkpoints: int = Field(3, ge=2, description="complete checkpoints kept (never fewer than 2)")
    stop_grace_s: int = Field(
        120, ge=1, description="how long a stop waits for the checkpoint before SIGKILL"
    )


# POSIX environment variable names: the keys are exported by rendered shell scripts and passed as
# `env KEY=VALUE` over SSH, so anything else (`$(...)`, spaces, `=`) could become shell syntax.
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class DistributedSection(_Section):
    collective_timeout_s: int = Field(3600, ge=1, description="the process group's timeout")
    nccl_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("nccl_env")
    @classmethod
    def _plain_env(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not ENV_NAME_RE.fullmatch(key):
                raise ValueError(
                    f"environment variable name {key!r} is not a POSIX name (letters, digits and '_', "
                    "not starting with a digit); refused: it would be written into launch scripts"
                )
            if any(c in value for c in "\0\n\r"):
                raise ValueError(
                    f"{key}: the value contains a NUL or line break, which no environment can carry"
                )
        return env


class RecoverySection(_Section):
    """What the console does when a run fails or hangs (read by the run controller; the
    trainer ignores it). Restarts resume from the newest checkpoint that verifies."""

    max_restarts: int = Field(
        3, ge=0, description="automatic restarts after a failure that may not repeat (0 = none)"
    )
    stall_restart_after_s: float = Field(
        0,
        ge=0,
        description="restart when a rank has been stalled this long (0 = auto: the larger of "
        "180 s and 20 step times)",
    )
    node_lost_after_s: float = Field(
        60,
        gt=0,
        description="a node the console cannot reach while the run makes no step for this long is "
        "lost (left out, or replaced by a spare); while steps go on it is only SSH trouble",
    )
    exclude_after: int = Field(2, ge=1, description="strikes against one node before it is left out")
    min_nodes: int = Field(1, ge=1, description="the fewest nodes a run continues on after leaving nodes out")
    backoff_s: float = Field(10, ge=0, description="wait before the first restart; doubles each restart")
    backoff_max_s: float = Field(360, ge=0, description="the longest wait between restarts")


class NotifySection(_Section):
    """Where the console tells a person what happened to a run (launched, failed, restarting,
    recovered, done, gave up). Delivery never holds the run up."""

    command: str = Field(
        "",
        description="a command run with the event as JSON on its stdin ('' = none); not run through a shell",
    )
    webhook: str = Field(
        "", description="a URL the event is POSTed to as JSON with a `text` field (Slack/Mattermost style)"
    )
    timeout_s: float = Field(10, gt=0, description="per delivery attempt")

    @field_validator("webhook")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if url and not re.match(r"https?://[^\s/]+", url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url


class TrainConfig(_Section):
    run: RunSection = RunSection()
    topology: TopologySection = TopologySection()
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    optim: OptimSection = OptimSection()
    loss: LossSection = LossSection()
    adversarial: AdversarialSection = AdversarialSection()
    deepspeed: DeepSpeedSection = DeepSpeedSection()
    schedule: ScheduleSection = ScheduleSection()
    distributed: DistributedSection = DistributedSection()
    recovery: RecoverySection = RecoverySection()
    notify: NotifySection = NotifySection()

    @property
    def clip_rule(self) -> ClipRule:
        m = self.model
        return clip_rule(m.family, m.encoder_time_downscale, m.patch_size)

    @model_validator(mode="after")
    def _family_encodes_the_clip(self) -> TrainConfig:
        rule = self.clip_rule
        problems = [
            f"data.{key}: {problem}"
            for key, problem in (
                ("frames", rule.frames_problem(self.data.frames)),
                ("height", rule.size_problem(self.data.height)),
                ("width", rule.size_problem(self.data.width)),
            )
            if problem
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _adversarial_has_frame_groups(self) -> TrainConfig:
        # T = 4k frames decode to T - 3, and the discriminator judges groups of 3 of them
        if self.adversarial.weight > 0 and self.data.frames < 8:
            raise ValueError(
                f"adversarial.weight > 0 needs data.frames >= 8 (the discriminator sees groups of 3 "
                f"decoded frames; {self.data.frames} frames decode to {self.data.frames - 3})"
            )
        return self

    @model_validator(mode="after")
    def _crops_fill_the_batch(self) -> TrainConfig:
        k = self.data.crops_per_clip
        if k > 1 and self.optim.batch_per_gpu % k:
            raise ValueError(
                f"optim.batch_per_gpu ({self.optim.batch_per_gpu}) must be a multiple of "
                f"data.crops_per_clip ({k}): a micro-batch holds whole clips' crops"
            )
        if k > 1 and self.loss.teacher_cache:
            raise ValueError(
                f"data.crops_per_clip ({k}) > 1 does not work with loss.teacher_cache: a cached "
                "clip has one latent window (use 1, or distil with the teacher online)"
            )
        return self

    @property
    def effective_batch(self) -> int:
        return self.optim.batch_per_gpu * self.optim.grad_accum * self.topology.world_size


class ConfigError(ValueError):
    """A configuration a user wrote is wrong; the message names the file, the key and the rule."""


def config_value(cfg: TrainConfig, dotted: str) -> object:
    """The value at a dotted run.toml key ("optim.lr", "distributed.nccl_env.NCCL_DEBUG"); None where
    there is none."""
    obj: object = cfg
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part, None)
    return obj


_KEYED = re.compile(r"[a-z_]+\.[a-z_]+: ")


def _clip_context(data: dict) -> dict:
    """The validation context that lets DataSection check the clip against its family: the rule of
    the `[model]` as written, when that section is valid (its own errors are reported apart)."""
    raw = data.get("model", {}) if isinstance(data, dict) else {}
    try:
        m = ModelSection.model_validate(raw if isinstance(raw, dict) else {})
    except ValidationError:
        return {}
    return {"clip_rule": clip_rule(m.family, m.encoder_time_downscale, m.patch_size)}


def format_validation_error(err: ValidationError, where: str) -> str:
    lines = [f"{where}: {err.error_count()} invalid value(s)"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if not e["loc"] and _KEYED.match(msg):  # a whole-config rule that names its own key
            lines.append(f"  {msg}")
            continue
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; unknown keys are never ignored)"
        given = e.get("input")
        quiet = e["type"] in ("extra_forbidden", "value_error") or isinstance(given, dict)
        shown = "" if quiet else f" (got {given!r})"
        lines.append(f"  {key}: {msg}{shown}")
    return "\n".join(lines)


def resolve_auto_family(data: dict, where: str = "config") -> dict:
    """`data` with `model.family = auto` replaced by what loss.teacher's config.json derives
    (teacher_geometry.auto_model: a published family, else `custom` shapes), so the config validated,
    and any run.toml written from it, names concrete shapes. Reads config.json only (no torch). A
    shape knob given beside `auto` that contradicts the teacher is an error naming both; so is a
    teacher `auto` cannot serve, or none."""
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict) or model.get("family") != AUTO:
        return data
    raw_loss = data.get("loss")
    loss: dict = raw_loss if isinstance(raw_loss, dict) else {}
    teacher = str(loss.get("teacher") or "")
    if not teacher:
        raise ConfigError(
            f"{where}: model.family = auto derives the student from the teacher's config.json, and "
            "loss.teacher is empty: set loss.teacher=DIR (a local diffusers video VAE directory), or name "
            f"the family ({', '.join(FAMILIES)})"
        )
    try:
        knobs = auto_model(geometry_of(teacher, str(loss.get("teacher_subfolder") or ""), "loss.teacher"))
    except TeacherError as err:
        said = str(err) if str(err).startswith(f"model.family = {AUTO}") else f"model.family = {AUTO}: {err}"
        raise ConfigError(f"{where}: {said}") from None
    given = {k: _as_tuple(model[k]) for k in SHAPE_KNOBS if k in model}
    wrong = [k for k, v in given.items() if v != knobs[k]]
    if wrong:
        raise ConfigError(
            f"{where}: "
            + "; ".join(
                f"model.{k} = {_toml(given[k])} contradicts model.family = auto, whose teacher {teacher} "
                f"gives {_toml(knobs[k])}"
                for k in wrong
            )
        )
    return {**data, "model": {**model, **knobs}}


def config_from_dict(data: dict, where: str = "config") -> TrainConfig:
    data = resolve_auto_family(data, where)
    try:
        return TrainConfig.model_validate(data, context=_clip_context(data))
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, where)) from None


def load_config(path: str | Path) -> TrainConfig:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text (binary bytes?)") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: a directory, not a config file") from None
    except PermissionError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    return config_from_dict(data, str(path))


def config_to_toml(cfg: TrainConfig) -> str:
    import tomli_w

    return tomli_w.dumps(cfg.model_dump(mode="json"))
