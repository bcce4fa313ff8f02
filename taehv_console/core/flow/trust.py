"""Trusting a node's SSH host key: fetch it once, show its fingerprint, and on confirmation add
exactly that key, never one fetched again after the user looked (the key served could have
changed in between: a reinstalled node, or someone in the middle)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from taehv_console.core.cluster.ssh import (
    HostTarget,
    SshSettings,
    add_known_host,
    fetch_host_key,
    known_keys,
    sha256_fingerprint,
)
from taehv_console.core.models import ProbeResult


@dataclass(frozen=True)
class HostKeyOffer:
    """The key a host presented, as shown to the user; `known` is what known_hosts holds for
    the same key type (None: nothing)."""

    host: str
    target: HostTarget
    key: Any  # paramiko PKey
    known: Any = None
    other_types: tuple[str, ...] = ()  # key types known_hosts holds for the host besides this one

    @property
    def key_type(self) -> str:
        return self.key.get_name()

    @property
    def fingerprint(self) -> str:
        return sha256_fingerprint(self.key)

    @property
    def line(self) -> str:
        return (
            f"{self.host} ({self.target.hostname} port {self.target.port}) presents {self.key_type} "
            f"{self.fingerprint}"
        )

    @property
    def already_trusted(self) -> bool:
        return self.known is not None and self.known == self.key

    @property
    def changed(self) -> bool:
        return self.known is not None and self.known != self.key


def offer_host_key(host: str, settings: SshSettings) -> HostKeyOffer:
    """Fetch the host's key once (SshError when it cannot be reached) with what is known of it."""
    target, key = fetch_host_key(host, settings)
    known = known_keys(settings, target.known_name)
    return HostKeyOffer(
        host=host,
        target=target,
        key=key,
        known=known.get(key.get_name()),
        other_types=tuple(t for t in known if t != key.get_name()),
    )


class TrustOutcome(enum.Enum):
    ADDED = "added"
    REPLACED = "replaced"
    ALREADY = "already trusted"
    REFUSED_CHANGED = "refused: a different key is trusted"


def trust_offered_key(offer: HostKeyOffer, settings: SshSettings, *, replace: bool = False) -> TrustOutcome:
    """Add exactly the offered key to known_hosts. A host whose known key differs is refused
    unless `replace` (the user confirmed the node was reinstalled). known_hosts is read again
    here, so a key trusted meanwhile by someone else is not overwritten silently."""
    current = known_keys(settings, offer.target.known_name).get(offer.key_type)
    if current is not None and current == offer.key:
        return TrustOutcome.ALREADY
    if current is not None and not replace:
        return TrustOutcome.REFUSED_CHANGED
    add_known_host(settings.known_hosts, offer.target.known_name, offer.key, replace=current is not None)
    return TrustOutcome.REPLACED if current is not None else TrustOutcome.ADDED


def needs_trust(result: ProbeResult) -> bool:
    """A probe refused because the host key is not known yet (its fix names `trust`); a changed
    key is not offered here (that takes `trust --replace`, after asking the node's admin)."""
    fix = result.fix or ""
    return not result.ok and "taehv-console trust " in fix and "--replace" not in fix
