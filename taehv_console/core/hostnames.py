"""Host-name syntax, checked before a name reaches paramiko, a rendered launch file or a shell:
anything that could act as an option (`-o...`) or as shell syntax is refused. A leaf: the planner's
renderer and the cluster code both check names with it.
"""

from __future__ import annotations

import ipaddress
import re

# Letters, digits, dot, dash, underscore (DNS names, ssh-config aliases). The first character may
# not be '-' (it would be read as an option by ssh, pdsh and friends). An IPv6 literal (colons, and
# '::1' starts with one) is checked apart, by ipaddress.
_HOST_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


class InvalidHostError(ValueError):
    """A host name that is not a plain name or address; the message says what is wrong with it."""


def validate_host(name: str) -> str:
    """`name` if it is a plain host name, alias or address, an IPv6 literal as its compressed text
    (`[::1]`, the bracketed form of host:port syntax, is `::1`); InvalidHostError otherwise."""
    if not isinstance(name, str) or not name:
        raise InvalidHostError("empty host name")
    if name.startswith("-"):
        raise InvalidHostError(f"host {name!r} starts with '-': it would be read as a command-line option")
    if ":" in name or name.startswith("["):
        return _ipv6(name)
    if not _HOST_RE.fullmatch(name):
        bad = sorted({c for c in name if not re.fullmatch(r"[A-Za-z0-9._-]", c)})
        shown = ", ".join(repr(c) for c in bad) or "too long"
        raise InvalidHostError(
            f"host {name!r} is not a plain host name or address (offending: {shown}); "
            "use letters, digits, '.', '-', '_', an IPv6 address, or an ssh-config alias"
        )
    return name


def _ipv6(name: str) -> str:
    text = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    if name.startswith("[") and not name.endswith("]"):
        raise InvalidHostError(
            f"host {name!r}: give the address alone ({name[1:].partition(']')[0]!r}); "
            "a node's SSH port goes in ~/.ssh/config (Port), the rendezvous port in --master-port"
        )
    if "%" in text:
        # torchrun's rendezvous endpoint allows only [\w.:-] in a host, so a scoped (link-local)
        # address can never be node 0's; the zone is this machine's interface name besides, which
        # means nothing on another node
        raise InvalidHostError(
            f"host {name!r}: an IPv6 address with a zone ('%{text.partition('%')[2]}') cannot be used: "
            "torchrun refuses it as a rendezvous address and the zone names an interface of one machine; "
            "use a global or unique-local address (fd00::/8) or a host name"
        )
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        raise InvalidHostError(
            f"host {name!r} is not a plain host name or address: a ':' belongs only in an IPv6 address, "
            "and this is not one"
        ) from None


def is_ipv6(host: str) -> bool:
    """Whether `host` is an IPv6 literal (bare, as validate_host returns it)."""
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 literal in brackets (`[::1]:29500`), as URLs and messages want it."""
    return f"[{host}]:{port}" if is_ipv6(host) else f"{host}:{port}"


def is_local_host(name: str) -> bool:
    """Hosts the console runs commands for directly, without SSH."""
    return name in LOCAL_HOSTS
