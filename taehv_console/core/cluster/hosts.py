"""Host names and host lists: validation (before any connection), DeepSpeed hostfiles, SLURM's
compressed host lists. A host name reaches paramiko and rendered launch files, so anything that
could act as an option (`-o...`) or as shell syntax is refused here, with the line it came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# the name rules live in core.hostnames (a leaf the planner uses too); re-exported where callers look
from taehv_console.core.hostnames import LOCAL_HOSTS, InvalidHostError, is_local_host, validate_host  # noqa: F401
from taehv_console.core.models import NodeSpec


class HostfileError(ValueError):
    """A hostfile line that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class HostfileEntry:
    host: str
    slots: int | None
    line: int


def parse_hostfile(text: str, where: str = "hostfile") -> tuple[HostfileEntry, ...]:
    """DeepSpeed's format: `host slots=N` per line, `#` starts a comment, blank lines ignored."""
    entries: list[HostfileEntry] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        try:
            host = validate_host(parts[0])
        except InvalidHostError as err:
            raise HostfileError(f"{where}:{lineno}: {err}") from None
        slots: int | None = None
        for extra in parts[1:]:
            key, sep, value = extra.partition("=")
            if key != "slots" or not sep:
                raise HostfileError(f"{where}:{lineno}: expected 'host slots=N', got {raw.strip()!r}")
            if not re.fullmatch(r"\d+", value) or int(value) < 1:
                raise HostfileError(f"{where}:{lineno}: slots must be a whole number ≥ 1, got {value!r}")
            slots = int(value)
        if host in seen:
            raise HostfileError(
                f"{where}:{lineno}: host {host!r} is listed twice (first on line {seen[host]}); "
                "give each machine one line with all its slots"
            )
        seen[host] = lineno
        entries.append(HostfileEntry(host, slots, lineno))
    if not entries:
        raise HostfileError(f"{where}: no hosts (expected lines like 'node1 slots=8')")
    return tuple(entries)


def read_hostfile(path: str | Path) -> tuple[NodeSpec, ...]:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise HostfileError(f"{path}: no such hostfile") from None
    except (OSError, UnicodeDecodeError) as err:
        raise HostfileError(f"{path}: cannot be read ({err})") from None
    return tuple(
        NodeSpec(host=e.host, machine_rank=i, slots=e.slots)
        for i, e in enumerate(parse_hostfile(text, str(path)))
    )


def format_hostfile(nodes: tuple[NodeSpec, ...] | list[NodeSpec]) -> str:
    return "".join(f"{n.host} slots={n.slots}\n" if n.slots else f"{n.host}\n" for n in nodes)


def expand_slurm_hostlist(expr: str) -> tuple[str, ...]:
    """Expand SLURM's compressed host list: `gpu[01-04,07]`, `a[1-2]-ib,b3`, `r[1-2]n[01-02]`.

    Zero padding of a range is kept (`[08-10]` → 08, 09, 10), as `scontrol show hostnames` does.
    """
    hosts: list[str] = []
    for item in _split_top_level(expr.strip()):
        if item:
            hosts.extend(_expand_one(item, expr))
    for h in hosts:
        validate_host(h)
    return tuple(hosts)


def _split_top_level(expr: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for c in expr:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"SLURM host list {expr!r}: unbalanced ']'")
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if depth:
        raise ValueError(f"SLURM host list {expr!r}: unbalanced '['")
    parts.append("".join(cur))
    return parts


def _expand_one(item: str, whole: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if not m:
        return [item]
    prefix, body, rest = item[: m.start()], m.group(1), item[m.end() :]
    values: list[str] = []
    for rng in body.split(","):
        lo, sep, hi = rng.partition("-")
        if not re.fullmatch(r"\d+", lo) or (sep and not re.fullmatch(r"\d+", hi)):
            raise ValueError(f"SLURM host list {whole!r}: bad range {rng!r}")
        if not sep:
            values.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"SLURM host list {whole!r}: range {rng!r} runs backwards")
        width = len(lo)
        values.extend(str(v).zfill(width) for v in range(int(lo), int(hi) + 1))
    return [h for v in values for h in _expand_one(prefix + v + rest, whole)]
