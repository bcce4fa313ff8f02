"""The console's own settings file: theme and key bindings.

    $TAEHV_CONSOLE_CONFIG, else $XDG_CONFIG_HOME/taehv-console/console.toml (~/.config/...)

    theme = "light"              # dark (default), light, high-contrast, or a user theme's name
    images = "half-blocks"       # the Samples view's images: auto (default), kitty, sixel, half-blocks
    [keys]                       # binding id = key(s); several keys comma-separated
    stop = "ctrl+x"
    help = "f1,question_mark"

Binding ids are listed by the help screen (`?`) and in README. A missing file is no error; a
broken one is, with the file, the key and what to write instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from taehv_console.core.toml_compat import tomllib


class ConsoleConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ConsoleConfig:
    path: Path | None = None  # the file read, None when there was none
    theme: str | None = None
    keys: dict[str, str] = field(default_factory=dict)
    images: str = "auto"  # how the Samples view draws images: one of IMAGE_MODES


# auto: Kitty graphics or Sixel where the terminal answers that it has them, else half-blocks
IMAGE_MODES = ("auto", "kitty", "sixel", "half-blocks")


def config_path() -> Path:
    explicit = os.environ.get("TAEHV_CONSOLE_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "taehv-console" / "console.toml"


def load_console_config(path: Path | None = None, binding_ids: Iterable[str] = ()) -> ConsoleConfig:
    """Read and check the settings file. `binding_ids` are the ids a [keys] entry may name."""
    path = path or config_path()
    if not path.is_file():
        return ConsoleConfig()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ConsoleConfigError(f"{path}: cannot read it: {err}") from None
    unknown = set(data) - {"theme", "keys", "images"}
    if unknown:
        raise ConsoleConfigError(
            f"{path}: unknown setting(s) {', '.join(sorted(unknown))}; "
            "the file takes `theme = NAME`, `images = MODE` and a [keys] table"
        )
    images = data.get("images", "auto")
    if images not in IMAGE_MODES:
        raise ConsoleConfigError(f"{path}: images must be one of {', '.join(IMAGE_MODES)}, not {images!r}")
    theme = data.get("theme")
    if theme is not None and (not isinstance(theme, str) or not theme):
        raise ConsoleConfigError(f'{path}: theme must be a theme name such as "dark"')
    keys = data.get("keys", {})
    if not isinstance(keys, dict):
        raise ConsoleConfigError(f'{path}: keys must be a table: [keys] then `binding-id = "key"` lines')
    known = set(binding_ids)
    for bid, value in keys.items():
        if known and bid not in known:
            raise ConsoleConfigError(
                f"{path}: [keys] {bid}: no binding has this id; ids: {', '.join(sorted(known))}"
            )
        if not isinstance(value, str) or not value.strip():
            raise ConsoleConfigError(f'{path}: [keys] {bid}: give the key as a string, e.g. {bid} = "ctrl+x"')
    return ConsoleConfig(
        path=path, theme=theme, keys={k: v.replace(" ", "") for k, v in keys.items()}, images=images
    )
