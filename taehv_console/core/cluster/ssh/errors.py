"""The errors of reaching a node over SSH, each with the fix it suggests; SshError, their base,
lives in nodecall (below this package) so a helper call's failure can carry one."""

from __future__ import annotations

from taehv_console.core.cluster.nodecall import Failure, NodeCallError, SshError


class HostKeyUnknownError(SshError):
    def __init__(self, host: str, known_name: str, key_type: str, fingerprint: str, known_hosts: str):
        super().__init__(
            host,
            f"{host}: host key not in {known_hosts} ({key_type} {fingerprint}); refused, nothing was run",
            f"check the fingerprint with the node's admin, then run: taehv-console trust {host}",
        )
        self.known_name = known_name
        self.key_type = key_type
        self.fingerprint = fingerprint


class HostKeyChangedError(SshError):
    def __init__(self, host: str, fingerprint: str, expected: str, known_hosts: str):
        super().__init__(
            host,
            f"{host}: HOST KEY CHANGED (now {fingerprint}, {known_hosts} has {expected}); refused, "
            "nothing was run: the node was reinstalled, or someone is in the middle",
            f"if the change is expected, run: taehv-console trust --replace {host}",
        )
        self.fingerprint = fingerprint
        self.expected = expected


class SshAuthError(SshError):
    pass


class SshConnectError(SshError):
    pass


class SshTimeoutError(SshError):
    pass


class SshUnreachableError(SshTimeoutError):
    """A node that stopped answering on a connection that was working (frozen, overloaded, cut)."""


class CommandTimeoutError(SshError):
    pass


class SshConfigError(SshError):
    pass


def is_unreachable(err: BaseException) -> bool:
    """Whether `err` says the node could not be reached at all (refused, timed out, stopped
    answering), as opposed to a refusal the node's configuration explains (a host key, a login).
    A helper call's error says it by its failure kind."""
    if isinstance(err, NodeCallError):
        return err.failure in (Failure.UNREACHABLE, Failure.TIMEOUT)
    return isinstance(err, (SshConnectError, SshTimeoutError, CommandTimeoutError))


class CommandError(ValueError):
    """An argv that cannot be sent safely (empty, not strings, a NUL or line break in a value)."""
