"""The trainer's per-rank records as the console reads them: an event line of
`events/rank-<r>.jsonl` and a heartbeat file `heartbeat/rank-<r>.json` (docs/design.md's
contracts), each checked once, here, where it is read. A record that is not text, not JSON, not an
object, or holds a known field of the wrong type (a step that is a string, a time that is a list)
is a `DamagedRecord` saying what is wrong, never a value that breaks a reader later; the readers
skip it, say which file and line, and go on with the rest. Unknown kinds and fields pass as they
are (readers ignore what they do not know), so a newer trainer's records still read.

The checks are strict (no "5" for 5, no true for 1): a record that passes is used as the very
dict it was read as, so what a reader sees is exactly what the file said.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from taehv_console.core.run.state import _json_kind, validation_text

Finite = Annotated[float, Field(allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0)]


class DamagedRecord(ValueError):
    """One event line or heartbeat that cannot be trusted; str() says why (no file: the reader
    knows it and names it with the line)."""


class _Record(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class EventLine(_Record):
    """The fields of an event line the console reads, with the types the trainer writes them in
    (`trainer/events.py`); a non-finite metric is written as null."""

    kind: str
    v: int | None = None
    time: Finite | None = None
    rank: Count | None = None
    step: Count | None = None
    world_size: Count | None = None
    max_steps: Count | None = None
    resumed_from: str | None = None
    skipped_checkpoints: list[str] | None = None
    reason: str | None = None
    message: str | None = None
    status: str | None = None
    path: str | None = None
    seconds: float | None = None
    bytes: int | None = None
    exit_status: int | None = None
    loss: float | None = None
    psnr: float | None = None
    lr: float | None = None
    samples_per_s: float | None = None
    nonfinite_skipped: Count | None = None
    first_step_s: float | None = None
    cache: dict[str, Any] | None = None


class Heartbeat(_Record):
    """A rank's heartbeat: what RankTracker and forensics read of it."""

    step: Count
    time: Finite
    pid: int | None = None
    host: str | None = None
    step_time_s: float | None = None
    wait_s: float | None = None
    data_wait_s: float | None = None
    stopped: bool | None = None
    waiting_since: Finite | None = None
    waiting_op: str | None = None


@functools.cache
def _fields(model: type[_Record]) -> frozenset[str]:
    return frozenset(model.model_fields)


def _load(data: bytes | str, what: str) -> dict[str, Any]:
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise DamagedRecord("not text (binary bytes)") from None
    if not text.strip():
        raise DamagedRecord("empty")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise DamagedRecord(f"not JSON ({err.msg} at column {err.colno})") from None
    except RecursionError:
        raise DamagedRecord("nested too deeply to read") from None
    except ValueError as err:  # an integer too long to convert
        raise DamagedRecord(f"not JSON ({err})") from None
    if not isinstance(value, dict):
        raise DamagedRecord(f"a JSON {_json_kind(value)} where {what} (an object) belongs")
    return value


def _check(model: type[_Record], value: dict[str, Any]) -> dict[str, Any]:
    # only the known fields go through the model: an unknown one is the reader's to ignore
    known = {k: v for k, v in value.items() if k in _fields(model)}
    try:
        model.model_validate(known)
    except ValidationError as err:
        raise DamagedRecord(validation_text(err)) from None
    return value


def parse_event(line: bytes | str) -> dict[str, Any]:
    """One event line, checked: the dict it holds, or DamagedRecord saying why not."""
    return _check(EventLine, _load(line, "an event"))


def check_event(value: dict[str, Any]) -> dict[str, Any]:
    """An event already parsed from JSON, checked the same way."""
    return _check(EventLine, value)


def parse_heartbeat(data: bytes | str) -> dict[str, Any]:
    """One heartbeat file's content, checked: the dict it holds, or DamagedRecord saying why not."""
    return _check(Heartbeat, _load(data, "a heartbeat"))


def damaged_line(path: str, line: int | None, why: str) -> str:
    """How a damaged record is named: the file, the line (for JSONL) and what is wrong."""
    return f"{path}" + (f" line {line}" if line is not None else "") + f": damaged, skipped: {why}"
