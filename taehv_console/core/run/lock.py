"""The run lock: held while a console controls a run, so a second console cannot launch, resume or
drive the same run at once.

An exclusive flock on RUN/lock. The kernel drops it when the holder dies, however it dies, so a
killed console never leaves a stale lock behind; on NFS the client maps flock to byte-range
locks, which the server arbitrates across nodes. The file also says who holds it, for the message
the second console prints.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # 3.10 has no typing.Self
    from typing_extensions import Self


class RunBusyError(RuntimeError):
    """Another console controls this run. `holder` is what it wrote into the lock file."""

    def __init__(self, path: Path, holder: dict[str, Any]):
        who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
        since = holder.get("since")
        when = time.strftime(" since %H:%M:%S", time.localtime(since)) if since else ""
        what = f" ({holder['purpose']})" if holder.get("purpose") else ""
        super().__init__(
            f"{path.parent.name}: another console controls this run: {who}{when}{what}. "
            "Only one console drives a run; stop it there, or use `taehv-console stop` (it asks that console)"
        )
        self.holder = holder


class RunLock:
    """Use as a context manager, or acquire()/release(). Not re-entrant across instances: two
    RunLock objects on the same file in one process exclude each other too (each opens the file)."""

    def __init__(self, path: str | Path, purpose: str = ""):
        self.path = Path(path)
        self.purpose = purpose
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> Self:
        if self._fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunBusyError(self.path, read_holder(self.path)) from None
        except BaseException:
            os.close(fd)
            raise
        # Who holds it, for the next console's message. Written after locking, so a reader that
        # fails to lock reads the current holder (or an empty file in the instant between).
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.time(),
            "purpose": self.purpose,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # no stale holder shown after a clean release
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_holder(path: str | Path) -> dict[str, Any]:
    """Who holds the lock, as its file says; {} when it says nothing readable (empty, released,
    damaged: not text, not JSON, not an object)."""
    try:
        holder = json.loads(Path(path).read_bytes() or b"{}")
    except (OSError, ValueError, RecursionError):  # ValueError: not JSON, not UTF-8
        return {}
    return holder if isinstance(holder, dict) else {}


def is_locked(path: str | Path) -> bool:
    """Whether some console holds the lock now (tries to take it and gives it straight back)."""
    path = Path(path)
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we took
    return False
