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


def validate_sections(data: dict[str, Any], where: str) -> TrainConfig:
    """TrainConfig from a dict of sections, with `where` naming the file (or --set) in errors."""
    return config_from_dict(data, where)


def override_config(cfg: TrainConfig, overrides: Iterable[str]) -> TrainConfig:
    """`cfg` with --set overrides applied and validated again as a whole."""
    overrides = list(overrides)
    if not overrides:
        return cfg
    data = apply_overrides(cfg.model_dump(mode="python"), overrides)
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
    if overrides:
        try:
            cfg = override_config(cfg, overrides)
        except ConfigError as err:
            raise ConfigError(f"{err} (on top of preset {name}, {path})") from None
        explicit = apply_overrides(explicit, overrides)
    return Preset(name=name, source=source, path=str(path), meta=meta, config=cfg, explicit=explicit)


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
