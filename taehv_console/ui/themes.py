"""Colour themes as data: `taehv_console/themes/*.toml` (shipped) and the user's
`$XDG_CONFIG_HOME/taehv-console/themes/*.toml`, each loaded into a Textual `Theme`.

Health colours live in the theme (`[health]` -> CSS variables `$health-ok` ... `$health-unknown`),
so widgets never hard-code a colour for a node's state.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from textual.color import Color, ColorParseError
from textual.theme import Theme

from taehv_console.core.toml_compat import tomllib

DEFAULT_THEME = "dark"
COLOR_FIELDS = (
    "primary",
    "secondary",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "success",
    "warning",
    "error",
    "boost",
)
HEALTH_STATES = ("ok", "degraded", "stalled", "failed", "lost", "unknown")
# Used by themes that do not set them (Textual's own themes among them): CSS that names
# $health-* must parse whatever theme is active.
HEALTH_DEFAULTS = {
    "ok": "#4CAF50",
    "degraded": "#E0B000",
    "stalled": "#F08030",
    "failed": "#E04040",
    "lost": "#B070D0",
    "unknown": "#8A8A8A",
}


class ThemeFileError(ValueError):
    """A theme file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class ThemeSet:
    themes: tuple[Theme, ...]
    errors: tuple[str, ...] = ()  # user theme files that failed: reported, never fatal

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.themes)


def shipped_theme_dir() -> Path:
    return Path(str(resources.files("taehv_console") / "themes"))


def user_theme_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "taehv-console" / "themes"


def health_variables(health: dict[str, str] | None = None) -> dict[str, str]:
    values = {**HEALTH_DEFAULTS, **(health or {})}
    return {f"health-{k}": v for k, v in values.items()}


def parse_theme(text: str, where: str) -> Theme:
    """A Theme from one TOML file's text; ThemeFileError names `where` and the bad field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ThemeFileError(f"{where}: not valid TOML: {err}") from None
    unknown = set(data) - {"name", "dark", "luminosity_spread", "text_alpha", "colors", "health"}
    if unknown:
        raise ThemeFileError(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected name, dark, "
            "luminosity_spread, text_alpha, [colors], [health]"
        )
    name = data.get("name") or Path(where).stem
    if not isinstance(name, str) or not name.strip():
        raise ThemeFileError(f"{where}: name must be a non-empty string")
    colors = data.get("colors", {})
    health = data.get("health", {})
    for table, allowed, label in ((colors, COLOR_FIELDS, "colors"), (health, HEALTH_STATES, "health")):
        if not isinstance(table, dict):
            raise ThemeFileError(f"{where}: [{label}] must be a table")
        for key, value in table.items():
            if key not in allowed:
                raise ThemeFileError(
                    f"{where}: [{label}] {key}: unknown; expected one of {', '.join(allowed)}"
                )
            try:
                Color.parse(value)
            except (ColorParseError, TypeError):
                raise ThemeFileError(
                    f"{where}: [{label}] {key} = {value!r} is not a colour (use #RRGGBB or a CSS colour name)"
                ) from None
    if "primary" not in colors:
        raise ThemeFileError(f"{where}: [colors] primary is required")
    dark = data.get("dark", True)
    if not isinstance(dark, bool):
        raise ThemeFileError(f"{where}: dark must be true or false")
    # Theme's float keywords, when the file sets them (typed Any: mypy cannot match ** to keywords)
    extra: dict[str, Any] = {k: float(data[k]) for k in ("luminosity_spread", "text_alpha") if k in data}
    return Theme(name=name, dark=dark, variables=health_variables(health), **colors, **extra)


def load_themes(dirs: tuple[Path, ...] | None = None) -> ThemeSet:
    """Shipped themes, then the user's (a user theme with a shipped name replaces it). A broken
    shipped theme is a bug and raises; a broken user theme is reported in `errors`."""
    dirs = dirs if dirs is not None else (shipped_theme_dir(), user_theme_dir())
    by_name: dict[str, Theme] = {}
    errors: list[str] = []
    for i, d in enumerate(dirs):
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.toml")):
            try:
                theme = parse_theme(path.read_text(), str(path))
            except (ThemeFileError, OSError) as err:
                if i == 0:
                    raise
                errors.append(str(err))
                continue
            by_name[theme.name] = theme
    order = {DEFAULT_THEME: 0, "light": 1, "high-contrast": 2}
    themes = sorted(by_name.values(), key=lambda t: (order.get(t.name, 9), t.name))
    return ThemeSet(tuple(themes), tuple(errors))
