"""Presets as data: TOML files holding a `[preset]` table and any run.toml sections.

A preset is validated through the one run.toml schema (trainer.config.TrainConfig), so an unknown
key, a wrong type or an out-of-range value is an error naming the file and the key. Shipped
presets live in the package; user presets in the config directory shadow them by name; any file
can be given by path. `--set section.key=value` overrides go through the same validation.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from taehv_console.core.toml_compat import tomllib
from trainer.config import SHAPE_KNOBS, ConfigError, TrainConfig, config_from_dict, format_validation_error
from trainer.families import FAMILIES, clip_rule

SECTIONS = tuple(TrainConfig.model_fields)  # run, topology, model, data, optim, ...
# Sections a user's preset file (or a base it names) must have: their schema defaults are no
# choice anyone made (one H100; LR 1e-4 for 1,000 steps), so a file without them was planned and
# trained as something it never said. Shipped presets name them all; --set changes a value on top.
REQUIRED_SECTIONS = {
    "topology": "which machines it runs on (without it: one H100)",
    "optim": "the learning rate and the steps (without it: LR 1e-4 for 1,000 steps)",
}


class PresetMeta(BaseModel):
    """The `[preset]` table: what the preset is for; nothing here reaches the trainer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = ""
    notes: str = ""
    gpu: str = Field("", description="GPU model the preset is tuned for (H100, A800) or 'cpu'")
    network: str = Field("", description="advised inter-node bandwidth, e.g. '25Gbit'")
    base: str = Field("", description="another preset whose values this one starts from")


@dataclass(frozen=True)
class Preset:
    name: str
    source: str  # "shipped", "user" or "file"
    path: str
    meta: PresetMeta
    config: TrainConfig
    # the sections exactly as the file (and its bases) wrote them: which keys were chosen on purpose
    explicit: dict[str, Any]
    # the clip values a family set with --set had fitted to its rule (override_clip_fit)
    fitted: tuple[ClipFit, ...] = ()

    @property
    def fitted_text(self) -> str:
        """What the family's clip rule changed in the preset's clip, in words ("" for nothing)."""
        return fitted_note(self.config.model.family, list(self.fitted)) if self.fitted else ""

    @property
    def topology_label(self) -> str:
        t = self.config.topology
        unit = "GPUs" if t.device == "cuda" else "CPU processes"
        return f"{t.nodes} x {t.gpus_per_node} {unit}"


def shipped_preset_dir() -> Path:
    return Path(str(resources.files("taehv_console") / "presets"))


def user_preset_dir() -> Path:
    """$TAEHV_CONSOLE_PRESETS, else $XDG_CONFIG_HOME/taehv-console/presets (~/.config/...)."""
    explicit = os.environ.get("TAEHV_CONSOLE_PRESETS")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "taehv-console" / "presets"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such preset file") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read: {err}") from None


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, table by table (a table in `over` does not replace the whole table)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _index(user_dir: Path | None) -> dict[str, tuple[str, Path]]:
    """name -> (source, path); user presets shadow shipped ones of the same name."""
    found: dict[str, tuple[str, Path]] = {}
    for source, folder in (("shipped", shipped_preset_dir()), ("user", user_dir)):
        if folder is None or not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            found[path.stem] = (source, path)
    return found


def _resolve_raw(
    name_or_path: str, user_dir: Path | None, seen: tuple[str, ...] = ()
) -> tuple[str, str, Path, dict[str, Any], PresetMeta]:
    """Read a preset and its chain of bases into one dict of sections (not yet validated)."""
    candidate = Path(name_or_path).expanduser()
    looks_like_path = name_or_path.endswith(".toml") or os.sep in name_or_path or "/" in name_or_path
    if looks_like_path:
        source, path, name = "file", candidate, candidate.stem
    else:
        index = _index(user_dir)
        if name_or_path not in index:
            known = ", ".join(sorted(index)) or "none"
            raise ConfigError(
                f"no preset named {name_or_path!r} (known: {known}); give a name, or a path to a .toml file"
            )
        source, path = index[name_or_path]
        name = name_or_path
    key = str(path.resolve())
    if key in seen:
        chain = " -> ".join(Path(s).stem for s in seen + (key,))
        raise ConfigError(f"{path}: preset.base forms a cycle ({chain})")

    data = _read_toml(path)
    meta_raw = data.pop("preset", {})
    where = str(path)
    if not isinstance(meta_raw, dict):
        raise ConfigError(f"{where}: 'preset' must be a table ([preset]), got {type(meta_raw).__name__}")
    try:
        meta = PresetMeta.model_validate(meta_raw)
    except ValidationError as err:
        text = format_validation_error(err, where)
        # name the key as the user wrote it: preset.<key>
        lines = text.splitlines()
        raise ConfigError("\n".join(lines[:1] + [line.replace("  ", "  preset.", 1) for line in lines[1:]]))
    if meta.base:
        _, _, _, base_data, base_meta = _resolve_raw(meta.base, user_dir, seen + (key,))
        data = deep_merge(base_data, data)
        # the GPU model and network advice describe the values inherited: keep them unless restated
        inherited = {"gpu": base_meta.gpu, "network": base_meta.network}
        meta = meta.model_copy(update={k: v for k, v in inherited.items() if not getattr(meta, k)})
    return name, source, path, data, meta


def parse_override(text: str) -> tuple[list[str], Any]:
    """'optim.lr=2e-4' -> (['optim', 'lr'], 0.0002). The value is read as TOML; a bare word that
    is not valid TOML (a path, a host name) is taken as a string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. optim.lr=2e-4")
    key, _, raw = text.partition("=")
    parts = [p.strip() for p in key.strip().split(".")]
    if len(parts) < 2 or not all(parts):
        raise ConfigError(
            f"--set {text!r}: the key must be section.key (sections: {', '.join(SECTIONS)}), e.g. optim.lr=2e-4"
        )
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply --set overrides to a dict of sections (validation happens after, on the whole)."""
    parsed = [parse_override(text) for text in overrides]
    out = data
    if any(parts == ["model", "family"] for parts, _ in parsed) and isinstance(out.get("model"), dict):
        # the shapes the data holds are the old family's: the new one sets its own (a knob --set
        # gives as well still meets the family's check)
        out = {**out, "model": {k: v for k, v in out["model"].items() if k not in SHAPE_KNOBS}}
    for parts, value in parsed:
        patch: dict[str, Any] = {}
        cursor = patch
        for part in parts[:-1]:
            cursor = cursor.setdefault(part, {})
        cursor[parts[-1]] = value
        out = deep_merge(out, patch)
    return out


FAMILY_KEY = "model.family"


def nearest_multiple(value: int, quantum: int, down: bool) -> int:
    """The multiple of `quantum` (at least one) nearest `value`; crops round down (a crop never
    outgrows its frames), frames to the nearest, a tie up."""
    below, above = value // quantum * quantum, (value // quantum + 1) * quantum
    if below < quantum:
        return above if value > 0 else quantum
    if down:
        return below
    return below if value - below < above - value else above


@dataclass(frozen=True)
class ClipFit:
    """A clip value the family's clip rule changed: the --set entry that says it, and the words."""

    setting: str  # e.g. "data.frames=16"
    said: str  # e.g. "frames 12 → 16 (a multiple of 8)"

    @property
    def key(self) -> str:
        return self.setting.partition("=")[0]


def family_clip_fit(cfg: TrainConfig, family: str) -> list[ClipFit]:
    """The clip values of `cfg` that `family`'s clip rule (trainer/families.clip_rule) would refuse,
    each moved to the nearest that fits: frames to the nearest whole time chunk (LTX 8, H3 17), crop
    sides down to whole multiples of 8·p. Empty for cfg's own family or an unknown one."""
    if family == cfg.model.family or family not in FAMILIES:
        return []
    rule, d = clip_rule(family), cfg.data
    fits = []
    if rule.frames_problem(d.frames):
        frames = nearest_multiple(d.frames, rule.frame_quantum, down=False)
        fits.append(
            ClipFit(
                f"data.frames={frames}", f"frames {d.frames} → {frames} (a multiple of {rule.frame_quantum})"
            )
        )
    for key, value in (("height", d.height), ("width", d.width)):
        if rule.size_problem(value):
            fixed = nearest_multiple(value, rule.space_scale, down=True)
            fits.append(
                ClipFit(
                    f"data.{key}={fixed}", f"crop {key} {value} → {fixed} (a multiple of {rule.space_scale})"
                )
            )
    return fits


def override_clip_fit(cfg: TrainConfig, overrides: Iterable[str]) -> tuple[str, list[ClipFit]]:
    """(family, fits) when --set changes the family and leaves the clip to the preset: a preset is
    family-neutral, so its clip is fitted to the family's rule (as the wizard's family choice does)
    instead of refused. A clip value given with --set too is the user's: checked, never moved."""
    family, given = "", set()
    for text in overrides:
        key, _, value = text.partition("=")
        key = key.strip()
        if key == FAMILY_KEY:
            family = value.strip().strip("\"'")
        given.add(key)
    if not family:
        return family, []
    return family, [fit for fit in family_clip_fit(cfg, family) if fit.key not in given]


def fitted_note(family: str, fits: list[ClipFit]) -> str:
    return f"{family}'s clip rule: " + "; ".join(fit.said for fit in fits)


def validate_sections(data: dict[str, Any], where: str) -> TrainConfig:
    """TrainConfig from a dict of sections, with `where` naming the file (or --set) in errors."""
    return config_from_dict(data, where)


def override_config(
    cfg: TrainConfig, overrides: Iterable[str], fits: Iterable[ClipFit] | None = None
) -> TrainConfig:
    """`cfg` with --set overrides applied and validated again as a whole; a family set without a
    clip gets cfg's clip fitted to its rule first (`fits`: override_clip_fit's, computed here
    unless the caller has them already)."""
    overrides = list(overrides)
    if not overrides:
        return cfg
    if fits is None:
        _family, fits = override_clip_fit(cfg, overrides)
    data = apply_overrides(cfg.model_dump(mode="python"), [*(f.setting for f in fits), *overrides])
    return validate_sections(data, "--set " + " ".join(overrides))


def load_preset(
    name_or_path: str, *, overrides: Iterable[str] = (), user_dir: Path | None | str = "default"
) -> Preset:
    """Load, merge with its bases, apply overrides and validate one preset.

    `name_or_path` is a preset name (user presets first, then shipped) or a path to a .toml file.
    Raises ConfigError naming the file and key on any problem.
    """
    udir = user_preset_dir() if user_dir == "default" else (Path(user_dir) if user_dir else None)
    name, source, path, data, meta = _resolve_raw(name_or_path, udir)
    explicit = dict(data)
    run = data.get("run", {})
    if isinstance(run, dict) and "preset" not in run:
        # the trainer's `start` event names the preset; default it to the file's name
        data = {**data, "run": {**run, "preset": name}}
    cfg = validate_sections(data, str(path))
    missing = [s for s in REQUIRED_SECTIONS if s not in data] if source != "shipped" else []
    if missing:
        said = "; ".join(f"[{s}] says {REQUIRED_SECTIONS[s]}" for s in missing)
        raise ConfigError(
            f"{path}: no {' and no '.join(f'[{s}]' for s in missing)} table ({said}); add "
            f"{'them' if len(missing) > 1 else 'it'}, or build on a shipped preset: "
            '[preset] base = "8gpu-h100"'
        )
    overrides = list(overrides)
    fits: list[ClipFit] = []
    if overrides:
        _family, fits = override_clip_fit(cfg, overrides)
        try:
            cfg = override_config(cfg, overrides, fits)
        except ConfigError as err:
            raise ConfigError(f"{err} (on top of preset {name}, {path})") from None
        explicit = apply_overrides(explicit, [*(f.setting for f in fits), *overrides])
    return Preset(
        name=name, source=source, path=str(path), meta=meta, config=cfg, explicit=explicit, fitted=tuple(fits)
    )


@dataclass(frozen=True)
class PresetListing:
    presets: tuple[Preset, ...]
    errors: tuple[str, ...]  # user presets that fail to load: listed, never fatal to the listing


def list_presets(user_dir: Path | None | str = "default") -> PresetListing:
    udir = user_preset_dir() if user_dir == "default" else (Path(user_dir) if user_dir else None)
    presets: list[Preset] = []
    errors: list[str] = []
    for name in sorted(_index(udir)):
        try:
            presets.append(load_preset(name, user_dir=udir))
        except ConfigError as err:
            errors.append(str(err))
    return PresetListing(tuple(presets), tuple(errors))
