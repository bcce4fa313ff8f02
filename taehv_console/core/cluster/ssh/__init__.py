"""Commands on the nodes: SSH through paramiko, or directly for this machine, behind one interface
(NodeRunner). Re-exports the names the rest of the console uses; each lives in one submodule."""

# Safety rules kept in this package so no caller can forget them: host names are validated before
# anything connects (config); unknown or changed host keys are refused (RejectPolicy, known_hosts
# loaded explicitly, `trust` is the only way in: hostkeys); commands are argv lists joined with
# shlex.join, so a value never reaches the remote shell unquoted (calls); no agent forwarding;
# connect, banner, auth and command timeouts; transport keepalive (runners); fan-out over a bounded
# thread pool, so 64 nodes are one round, not 64 (pool).
#
# Every remote call has a deadline, including the steps paramiko would wait on forever (a channel
# open or exec request a frozen sshd never answers): past `answer_timeout_s` the connection is
# dropped and the node reported unreachable (runners); the pool then answers "unreachable" at once
# for that node while it reconnects in the background, so a hung node costs one deadline, not one
# per poll (pool).
#
# Modules, each importing only those before it: errors, config, hostkeys, calls, runners, pool.
# paramiko is imported inside the functions that handle a connection or a host key, never at load.

from __future__ import annotations

from taehv_console.core.cluster.nodecall import SshError
from taehv_console.core.cluster.ssh.calls import NodeRunner
from taehv_console.core.cluster.ssh.config import HostTarget, SshSettings, master_address, resolve_target
from taehv_console.core.cluster.ssh.errors import (
    CommandError,
    CommandTimeoutError,
    HostKeyChangedError,
    HostKeyUnknownError,
    SshUnreachableError,
    is_unreachable,
)
from taehv_console.core.cluster.ssh.hostkeys import (
    add_known_host,
    fetch_host_key,
    known_keys,
    sha256_fingerprint,
)
from taehv_console.core.cluster.ssh.pool import SshPool, fan_out
from taehv_console.core.cluster.ssh.runners import LocalRunner, connect

__all__ = [
    "CommandError",
    "CommandTimeoutError",
    "HostKeyChangedError",
    "HostKeyUnknownError",
    "HostTarget",
    "LocalRunner",
    "NodeRunner",
    "SshError",
    "SshPool",
    "SshSettings",
    "SshUnreachableError",
    "add_known_host",
    "connect",
    "fan_out",
    "fetch_host_key",
    "is_unreachable",
    "known_keys",
    "master_address",
    "resolve_target",
    "sha256_fingerprint",
]
