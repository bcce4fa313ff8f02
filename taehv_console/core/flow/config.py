"""Flow step 2, choose the config: --preset (or auto, derived for the detected cluster) with --set
and --data; an existing run's run.toml; generated clips for a CPU run without data. Also the
preset choices and override form the TUI offers, checked by the same validation."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from taehv_console.core.flow.options import FlowOptions
from taehv_console.core.models import ProbeResult, Topology
from taehv_console.core.plan.derive import ResolvedConfig, auto_select, fit_reasons
from taehv_console.core.plan.planner import estimate_memory
from taehv_console.core.plan.presets import list_presets, load_preset, override_config
from taehv_console.core.run.rundir import RunDir
from trainer.config import ConfigError, TrainConfig

Note = Callable[[str], None]


@dataclass(frozen=True)
class ChosenConfig:
    config: TrainConfig
    chosen: str  # how it was chosen, in words ("auto: ...", "preset NAME (PATH)", "run ID (PATH)")
    reasons: tuple[tuple[str, str], ...] = ()  # (key, why) of a derived or fitted value


def _auto(
    options: FlowOptions, topology: Topology, probes: Sequence[ProbeResult], overrides: list[str]
) -> ResolvedConfig:
    facts = [p.facts for p in probes if p.facts is not None]
    gpus = [f.visible_gpu_count for f in facts]
    device = "cuda" if facts and all(gpus) else "cpu"
    slots = [n.slots for n in topology.nodes if n.slots]
    if device == "cuda":
        per_node = min(gpus)
        if slots:
            per_node = min(per_node, min(slots))
        if topology.processes_per_node:
            per_node = min(per_node, topology.processes_per_node)
        g = facts[0].visible_gpus[0]
        # probes report GiB; presets speak GB
        memory_gb = round(min(x.memory_gb for f in facts for x in f.visible_gpus) * 1.073741824, 1)
        return auto_select(
            topology.node_count,
            per_node,
            device="cuda",
            gpu_name=g.name,
            gpu_memory_gb=memory_gb,
            overrides=overrides,
        )
    per_node = min(slots) if slots else (topology.processes_per_node or 2)
    return auto_select(topology.node_count, per_node, device="cpu", overrides=overrides)


def choose_config(options: FlowOptions, topology: Topology, probes: Sequence[ProbeResult]) -> ChosenConfig:
    """The config for --preset (or auto), --set and --data on this cluster. ConfigError when the
    preset or an override is wrong."""
    overrides = list(options.overrides)
    if options.data:
        overrides.append(f"data.source={json.dumps(options.data)}")
    if options.preset != "auto":
        preset = load_preset(options.preset, overrides=overrides)
        # a family set without a clip: what its clip rule changed in the preset's clip, said
        fitted = f"; {preset.fitted_text}" if preset.fitted else ""
        reasons = tuple(
            (r.key, r.reason) for r in fit_reasons(preset.config, preset.config.model.family, preset.fitted)
        )
        return ChosenConfig(preset.config, f"preset {preset.name} ({preset.path}){fitted}", reasons)
    resolved = _auto(options, topology, probes, overrides)
    reasons = tuple((r.key, r.reason) for r in resolved.reasons)
    return ChosenConfig(resolved.config, f"auto: {resolved.summary}", reasons)


def run_config(
    options: FlowOptions,
    topology: Topology,
    probes: Sequence[ProbeResult],
    existing: RunDir | None = None,
    note: Note | None = None,
) -> ChosenConfig:
    """What a launch runs: an existing run's run.toml, else choose_config; a CPU config without
    data trains on generated clips (made once under the runs directory)."""
    if existing is not None:
        return ChosenConfig(existing.load_config(), f"run {existing.run_id} ({existing.run_toml})")
    chosen = choose_config(options, topology, probes)
    cfg = chosen.config
    if not cfg.data.source and not options.data and cfg.topology.device == "cpu":
        clips = generated_clips(options.runs, cfg, note)
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"source": clips})})
        return replace(
            chosen,
            config=cfg,
            chosen=chosen.chosen + f"; no GPU and no --data: training on generated clips in {clips}",
        )
    return chosen


def generated_clips(runs_dir: str, cfg: TrainConfig, note: Note | None = None) -> str:
    """Real video files for the smoke preset, made once per size under the runs directory (shared
    storage, so every node reads the same clips) and reused by later runs."""
    d = cfg.data
    # "v2": the generator changed (a natural spectrum); clips made by an older one are not reused
    folder = Path(runs_dir).absolute() / "generated-clips" / f"v2-{d.frames}x{d.height}x{d.width}"
    done = folder / ".complete"
    if not done.exists():
        # lazy: the video encoder and numpy cost half a second, and only this path needs them
        from trainer.synthetic import make_synthetic

        if note is not None:
            note(f"generating demo clips in {folder}")
        # enough frames for the largest frame step, and enough clips for a validation split
        make_synthetic(
            folder, clips=12, frames=d.frames * d.max_delta + 4, height=d.height, width=d.width, seed=0
        )
        done.write_text("")
    return str(folder)


# ------------------------------------------------------------------------------ preset choices


@dataclass(frozen=True)
class PresetChoice:
    name: str  # preset name, or "auto" for the one derived for this cluster
    title: str
    topology: str
    effective_batch: int | None
    lr: float | None
    zero_stage: int | None
    memory_gb: float | None
    device_gb: float | None
    fits: bool | None
    matches: bool  # made for the detected topology
    description: str = ""
    reasons: tuple[tuple[str, str], ...] = ()  # (key, why) of a derived config
    error: str = ""
    config: TrainConfig | None = None  # the form starts from its values


def _failed_choice(name: str, title: str, error: str) -> PresetChoice:
    return PresetChoice(name, title, "", None, None, None, None, None, None, False, error=error)


def _choice(
    name: str,
    title: str,
    cfg: TrainConfig,
    matches: bool,
    description: str = "",
    reasons: tuple[tuple[str, str], ...] = (),
) -> PresetChoice:
    t = cfg.topology
    mem = estimate_memory(cfg)
    unit = "GPUs" if t.device == "cuda" else "CPU procs"
    return PresetChoice(
        name=name,
        title=title,
        topology=f"{t.nodes}×{t.gpus_per_node} {unit}",
        effective_batch=cfg.effective_batch,
        lr=cfg.optim.lr,
        zero_stage=cfg.deepspeed.zero_stage,
        memory_gb=round(mem.per_gpu_gb, 1),
        device_gb=mem.gpu_gb,
        fits=mem.fits,
        matches=matches,
        description=description,
        reasons=reasons,
        config=cfg,
    )


def preset_choices(
    options: FlowOptions, topology: Topology, probes: Sequence[ProbeResult]
) -> tuple[PresetChoice, ...]:
    """The config auto picks (or derives) for this cluster first, then every shipped and user
    preset, each with effective batch, LR, ZeRO stage and the memory estimate."""
    out: list[PresetChoice] = []
    want = None
    try:
        auto = choose_config(replace(options, preset="auto", overrides=()), topology, probes)
        t = auto.config.topology
        want = (t.nodes, t.gpus_per_node, t.device)
        out.append(
            _choice("auto", "auto", auto.config, True, auto.chosen.removeprefix("auto: "), auto.reasons)
        )
    except ConfigError as err:
        out.append(_failed_choice("auto", "auto", str(err)))
    listing = list_presets()
    for p in listing.presets:
        t = p.config.topology
        out.append(
            _choice(
                p.name, p.name, p.config, (t.nodes, t.gpus_per_node, t.device) == want, p.meta.description
            )
        )
    for error in listing.errors:
        out.append(_failed_choice("?", "user preset", error))
    return tuple(out)


def check_overrides(cfg: TrainConfig, overrides: list[str]) -> tuple[TrainConfig | None, str]:
    """(config with the overrides, "") or (None, the validation message): the preset form's check,
    core's own validation."""
    try:
        return override_config(cfg, overrides), ""
    except (ConfigError, ValueError) as err:
        return None, str(err)
