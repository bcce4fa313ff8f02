"""Host keys: OpenSSH fingerprints, the keys known_hosts holds, the key a host presents, adding it
(`trust`), and the policy that refuses a connection to any host whose key is not known."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn

from taehv_console.core.cluster.ssh.config import (
    HostTarget,
    SshSettings,
    open_socket,
    quiet_paramiko,
    resolve_target,
)
from taehv_console.core.cluster.ssh.errors import HostKeyUnknownError, SshConnectError

if TYPE_CHECKING:
    import paramiko


def sha256_fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's form: SHA256:<base64 of the key blob's SHA-256, no padding>."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def fetch_host_key(alias: str, settings: SshSettings) -> tuple[HostTarget, paramiko.PKey]:
    """The key the host presents, fetched without authenticating (for `trust`)."""
    import paramiko

    target = resolve_target(alias, settings)
    quiet_paramiko()
    sock = open_socket(target, settings.connect_timeout_s)
    transport = paramiko.Transport(sock)
    try:
        transport.banner_timeout = settings.connect_timeout_s
        transport.start_client(timeout=settings.connect_timeout_s)
        return target, transport.get_remote_server_key()
    except paramiko.SSHException as err:
        raise SshConnectError(alias, f"{alias}: SSH handshake failed: {err}") from None
    finally:
        transport.close()


def known_keys(settings: SshSettings, known_name: str) -> dict[str, paramiko.PKey]:
    """Key type → key that known_hosts (user's, then system's) holds for a host."""
    import paramiko

    out: dict[str, paramiko.PKey] = {}
    for path in (settings.system_known_hosts_path, str(settings.known_hosts)):
        if path and os.path.isfile(os.path.expanduser(path)):
            keys = paramiko.HostKeys(os.path.expanduser(path)).lookup(known_name)
            if keys:
                out.update({t: keys[t] for t in keys})
    return out


def add_known_host(path: str | Path, known_name: str, key: paramiko.PKey, *, replace: bool = False) -> None:
    """Append `known_name keytype base64` to known_hosts; with replace, drop the host's old lines
    first (hashed ones too). Other lines, comments included, are kept as they were."""
    import paramiko

    path = Path(os.path.expanduser(str(path)))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    if replace:
        lines = [ln for ln in lines if not _line_names_host(ln, known_name, paramiko)]
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines.append(f"{known_name} {key.get_name()} {key.get_base64()}\n")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(lines))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)  # a crash mid-write must not leave a truncated known_hosts


def _line_names_host(line: str, known_name: str, paramiko: ModuleType) -> bool:
    fields = line.split()
    if not fields or fields[0].startswith("#"):
        return False
    for name in fields[0].split(","):
        if name.startswith("|1|"):
            if paramiko.HostKeys.hash_host(known_name, name) == name:
                return True
        elif name == known_name:
            return True
    return False


def refusing_policy(alias: str, known_hosts: str) -> paramiko.MissingHostKeyPolicy:
    """paramiko's RejectPolicy, raising an error that carries the fingerprint and the fix."""
    import paramiko

    class RefuseUnknownHost(paramiko.RejectPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> NoReturn:
            raise HostKeyUnknownError(alias, hostname, key.get_name(), sha256_fingerprint(key), known_hosts)

    return RefuseUnknownHost()
