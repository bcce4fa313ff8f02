"""Host-name syntax, checked before a name reaches paramiko, a rendered launch file or a shell:
anything that could act as an option (`-o...`) or as shell syntax is refused. A leaf: the planner's
renderer and the cluster code both check names with it.
"""

from __future__ import annotations

import re

# Letters, digits, dot, dash, underscore (DNS names, ssh-config aliases), colon (IPv6). The first
# character may not be '-' (it would be read as an option by ssh, pdsh and friends).
_HOST_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:-]{0,252}")
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


class InvalidHostError(ValueError):
    """A host name that is not a plain name or address; the message says what is wrong with it."""


def validate_host(name: str) -> str:
    """Return `name` if it is a plain host name, alias or address; raise InvalidHostError otherwise."""
    if not isinstance(name, str) or not name:
        raise InvalidHostError("empty host name")
    if name.startswith("-"):
        raise InvalidHostError(f"host {name!r} starts with '-': it would be read as a command-line option")
    if not _HOST_RE.fullmatch(name):
        bad = sorted({c for c in name if not re.fullmatch(r"[A-Za-z0-9._:-]", c)})
        shown = ", ".join(repr(c) for c in bad) or "too long"
        raise InvalidHostError(
            f"host {name!r} is not a plain host name or address (offending: {shown}); "
            "use letters, digits, '.', '-', '_' or an ssh-config alias"
        )
    return name


def is_local_host(name: str) -> bool:
    """Hosts the console runs commands for directly, without SSH."""
    return name in LOCAL_HOSTS
