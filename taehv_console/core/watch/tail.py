"""Follow a run's files by byte offset, here or on a node over SSH.

Append-only files (events/*.jsonl, logs/*.log) are read from the last offset: nothing is re-read,
a partial last line waits for its end, a file that appears later is picked up, and a replaced or
truncated file starts again from 0. Small files replaced atomically (heartbeats, state.json) are
read whole when their inode, mtime or size changed.

The reading half (`read_chunks`) is a plain function; over SSH the same function runs on the node
as `python -m taehv_console.core.watch.tail` with a JSON request on stdin, so both paths behave
alike and the console keeps the offsets either way.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from taehv_console.core.cluster.ssh import NodeRunner

TAIL_MODULE = "taehv_console.core.watch.tail"
DEFAULT_MAX_BYTES = 8 << 20  # per poll and file: one huge backlog never blocks the other files


@dataclass(frozen=True)
class Chunk:
    path: str  # relative to the root, with "/"
    ino: int
    size: int  # file size when read
    mtime_ns: int
    start: int  # file offset of data[0] (0 for whole files)
    data: bytes
    whole: bool = False


def _matches(root: Path, pattern: str) -> list[tuple[str, os.DirEntry]]:
    # One scandir per directory instead of Path.glob: cheaper for hundreds of heartbeat files.
    folder, _, name_pat = pattern.rpartition("/")
    try:
        entries = list(os.scandir(root / folder if folder else root))
    except OSError:
        return []  # the directory does not exist yet: the run has not written it
    out = []
    for e in entries:
        if fnmatch.fnmatchcase(e.name, name_pat):
            out.append((f"{folder}/{e.name}" if folder else e.name, e))
    return out


def read_chunks(
    root: str | Path,
    append: Sequence[str] = (),
    whole: Sequence[str] = (),
    known: Mapping[str, Sequence[int]] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> list[Chunk]:
    """New data under root. known[path] is [ino, offset] for append patterns and
    [ino, mtime_ns, size] for whole patterns (what the caller has already seen)."""
    root = Path(root)
    known = known or {}
    out: list[Chunk] = []
    for pattern in append:
        for rel, entry in _matches(root, pattern):
            k = known.get(rel)
            try:
                st = entry.stat()
            except OSError:
                continue
            offset = int(k[1]) if k and int(k[0]) == st.st_ino and st.st_size >= int(k[1]) else 0
            if st.st_size <= offset and k and int(k[0]) == st.st_ino:
                continue  # nothing new
            chunk = _read_from(entry.path, rel, offset, max_bytes, k)
            if chunk is not None:
                out.append(chunk)
    for pattern in whole:
        for rel, entry in _matches(root, pattern):
            k = known.get(rel)
            try:
                st = entry.stat()
            except OSError:
                continue
            if k and [int(x) for x in k[:3]] == [st.st_ino, st.st_mtime_ns, st.st_size]:
                continue
            try:
                with open(entry.path, "rb") as f:
                    fst = os.fstat(f.fileno())  # the file actually opened, if it was replaced meanwhile
                    data = f.read(min(max_bytes, fst.st_size))
            except OSError:
                continue
            out.append(Chunk(rel, fst.st_ino, fst.st_size, fst.st_mtime_ns, 0, data, True))
    return out


def _read_from(path: str, rel: str, offset: int, max_bytes: int, k: Sequence[int] | None) -> Chunk | None:
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not k or int(k[0]) != st.st_ino or st.st_size < offset:
                offset = 0  # new, replaced or truncated since the stat: start over
            if st.st_size <= offset and k and int(k[0]) == st.st_ino:
                return None
            f.seek(offset)
            # read(n) allocates n bytes up front: ask for what is there, not the cap
            data = f.read(min(max_bytes, st.st_size - offset))
    except OSError:
        return None
    return Chunk(rel, st.st_ino, st.st_size, st.st_mtime_ns, offset, data, False)


# -------------------------------------------------------------------------------- where to read


class ChunkSource(Protocol):
    name: str

    def read(
        self,
        root: str,
        append: Sequence[str],
        whole: Sequence[str],
        known: Mapping[str, Sequence[int]],
        max_bytes: int,
    ) -> list[Chunk]: ...


class LocalFiles:
    """The run directory as this machine sees it (shared storage, or the console's own node)."""

    name = "local"

    def read(
        self,
        root: str,
        append: Sequence[str],
        whole: Sequence[str],
        known: Mapping[str, Sequence[int]],
        max_bytes: int,
    ) -> list[Chunk]:
        return read_chunks(root, append, whole, known, max_bytes)


class RemoteFiles:
    """The run directory as one node sees it, read by the helper over that node's runner."""

    def __init__(self, runner: NodeRunner, timeout_s: float = 30.0):
        self.runner = runner
        self.name = runner.host
        self.timeout_s = timeout_s

    def read(
        self,
        root: str,
        append: Sequence[str],
        whole: Sequence[str],
        known: Mapping[str, Sequence[int]],
        max_bytes: int,
    ) -> list[Chunk]:
        request = json.dumps(
            {
                "root": str(root),
                "append": list(append),
                "whole": list(whole),
                "known": {k: list(v) for k, v in known.items()},
                "max_bytes": max_bytes,
            }
        )
        reply = self.runner.call(TAIL_MODULE, stdin_data=request, timeout=self.timeout_s, require=("chunks",))
        return decode_response(reply.value())


def encode_response(chunks: Iterable[Chunk]) -> str:
    return json.dumps(
        {
            "time": time.time(),
            "chunks": [
                {
                    "path": c.path,
                    "ino": c.ino,
                    "size": c.size,
                    "mtime_ns": c.mtime_ns,
                    "start": c.start,
                    "whole": c.whole,
                    "data": base64.b64encode(c.data).decode(),
                }
                for c in chunks
            ],
        }
    )


def decode_response(data: Mapping[str, Any]) -> list[Chunk]:
    """The chunks of the helper's reply (the runner's call has checked that it is one)."""
    return [
        Chunk(
            c["path"],
            int(c["ino"]),
            int(c["size"]),
            int(c["mtime_ns"]),
            int(c["start"]),
            base64.b64decode(c["data"]),
            bool(c["whole"]),
        )
        for c in data["chunks"]
    ]


# ----------------------------------------------------------------------------- the console side


@dataclass
class TailResult:
    lines: dict[str, list[bytes]] = field(default_factory=dict)  # complete lines, without b"\n"
    whole: dict[str, bytes] = field(default_factory=dict)
    reset: set[str] = field(default_factory=set)  # replaced or truncated: earlier lines are void
    more: bool = False  # some file has more than max_bytes pending: poll again soon


class Tailer:
    """Offsets and partial lines for a set of patterns under one root, read through a ChunkSource."""

    def __init__(
        self,
        root: str | Path,
        source: ChunkSource | None = None,
        *,
        append: Sequence[str] = (),
        whole: Sequence[str] = (),
        max_bytes: int = DEFAULT_MAX_BYTES,
    ):
        self.root = str(root)
        self.source = source or LocalFiles()
        self.append = tuple(append)
        self.whole_patterns = tuple(whole)
        self.max_bytes = max_bytes
        self._known: dict[str, list[int]] = {}
        self._partial: dict[str, bytes] = {}

    def offset(self, path: str) -> int:
        k = self._known.get(path)
        return k[1] if k and len(k) == 2 else 0

    def poll(self) -> TailResult:
        chunks = self.source.read(self.root, self.append, self.whole_patterns, self._known, self.max_bytes)
        res = TailResult()
        for c in chunks:
            if c.whole:
                self._known[c.path] = [c.ino, c.mtime_ns, c.size]
                res.whole[c.path] = c.data
                continue
            k = self._known.get(c.path)
            if k is not None and (k[0] != c.ino or c.start < k[1]):
                res.reset.add(c.path)
                self._partial.pop(c.path, None)
            end = c.start + len(c.data)
            self._known[c.path] = [c.ino, end]
            if end < c.size:
                res.more = True
            buf = self._partial.pop(c.path, b"") + c.data
            cut = buf.rfind(b"\n")
            if cut < 0:
                if buf:
                    self._partial[c.path] = buf
                continue
            if cut + 1 < len(buf):
                self._partial[c.path] = buf[cut + 1 :]
            res.lines[c.path] = buf[:cut].split(b"\n")
        return res


def main() -> int:
    """Remote helper: JSON request on stdin, JSON response (one line) on stdout."""
    req = json.loads(sys.stdin.read() or "{}")
    chunks = read_chunks(
        req["root"],
        req.get("append", ()),
        req.get("whole", ()),
        req.get("known", {}),
        int(req.get("max_bytes", DEFAULT_MAX_BYTES)),
    )
    sys.stdout.write(encode_response(chunks) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
