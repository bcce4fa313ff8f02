"""The preset form's fields as text and back as `--set` overrides: pure functions of a config's
values (no validation here: core/flow/config.check_overrides does that), light enough for a screen
to import before the planner's models are loaded."""

from __future__ import annotations

import json
import shlex

# the schema loads pydantic (~0.5 s): this module is imported only with the preset screen, which
# imports it anyway
from trainer.config import TrainConfig, config_value

# Fields the preset form offers; anything else goes in the free "more overrides" line.
FORM_FIELDS: tuple[tuple[str, str], ...] = (
    ("optim.max_steps", "max steps"),
    ("optim.batch_per_gpu", "batch per GPU"),
    ("optim.grad_accum", "grad accumulation"),
    ("optim.lr", "learning rate"),
    ("schedule.checkpoint_every", "checkpoint every"),
    ("data.source", "data source"),
)


def field_text(cfg: TrainConfig, dotted: str) -> str:
    """A config value as the form shows it (and as an override would write it)."""
    value = config_value(cfg, dotted)
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)


def override_text(key: str, text: str, base: TrainConfig | None = None) -> str:
    """`key=value` for a form field: strings (paths, such as data.source or loss.teacher) quoted as
    TOML, numbers as typed."""
    text = text.strip()
    if key == "data.source" or (base is not None and isinstance(config_value(base, key), str)):
        return f"{key}={json.dumps(text)}"
    return f"{key}={text}"


def form_overrides(base: TrainConfig, fields: dict[str, str], more: str) -> list[str]:
    """--set entries for the form: each field whose text differs from `base`, then the free line
    (space-separated key=value)."""
    out = [override_text(k, v, base) for k, v in fields.items() if v.strip() != field_text(base, k)]
    return out + [item for item in shlex.split(more) if item]
