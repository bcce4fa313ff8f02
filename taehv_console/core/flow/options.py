"""What a front end asks the flow for, as one typed value: the CLI builds it from its arguments,
the TUI keeps one and replaces it as the user edits (a hostfile typed in, say)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from taehv_console.core.cluster.ssh import SshSettings
from taehv_console.core.models import BackendKind


class EnvError(ValueError):
    """A KEY=VALUE launch variable that is not one."""


def parse_env(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`KEY=VALUE` entries (the `--env` option) as a dict; a plain POSIX variable name is required,
    since every key ends up in a rendered shell script."""
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.replace("_", "a").isalnum() or key[0].isdigit() or not key.isascii():
            raise EnvError(f"--env {item!r}: expected KEY=VALUE with a plain variable name")
        env[key] = value
    return env


def repeated_keys(overrides: Sequence[str], env: Sequence[str], data: str | None = None) -> tuple[str, ...]:
    """One warning per key given more than once in --set or --env, naming every value in order and
    the one used (the last, as for any dict); and for --data beside a --set data.source, which
    --data overrides. Items without '=' are passed over: their own check names them later."""
    said = []
    sets = _values(overrides, lambda key: ".".join(part.strip() for part in key.strip().split(".")))
    for key, values in sets.items():
        if data and key == "data.source":
            given = ", then ".join(repr(v) for v in values)
            said.append(f"--set data.source ({given}) is overridden by --data: {data!r} is used")
        elif len(values) > 1:
            said.append(_repeated("--set", key, values))
    said += [_repeated("--env", key, values) for key, values in _values(env, str).items() if len(values) > 1]
    return tuple(said)


def _values(items: Sequence[str], key_of: Callable[[str], str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if sep:
            out.setdefault(key_of(key), []).append(value)
    return out


def _repeated(flag: str, key: str, values: list[str]) -> str:
    given = ", then ".join(repr(v) for v in values)
    return f"{flag} {key} is given {len(values)} times ({given}): the last, {values[-1]!r}, is used"


@dataclass(frozen=True)
class FlowOptions:
    """The flow's inputs. `backend` None means auto (from the detected topology); `run` names an
    existing run directory or id; `env` is added to every node's launcher environment."""

    hosts: str | None = None
    spares: str | None = None  # a hostfile of spare hosts that may take a left-out node's place
    preset: str = "auto"
    data: str | None = None
    runs: str = "runs"
    run: str | None = None
    overrides: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    master_port: int | None = None
    backend: BackendKind | None = None
    grace_s: float | None = None
    ssh: SshSettings = field(default_factory=SshSettings.from_env)
    warnings: tuple[str, ...] = ()  # about the options themselves (a key given twice): shown first
