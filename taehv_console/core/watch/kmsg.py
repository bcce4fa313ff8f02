"""Xid events from the kernel log: the lines NVIDIA's driver writes when a GPU or its link fails,
e.g. "NVRM: Xid (PCI:0000:3b:00): 79, pid=2417, name=python3, GPU has fallen off the bus."

The node agent reads `/dev/kmsg` without blocking, from its own start on (an Xid from before the
run is not this run's evidence). Reading it needs root or `kernel.dmesg_restrict = 0`; where it
cannot, the agent says why once and carries on. Which Xids mean bad hardware follows NVIDIA's Xid
catalogue (docs.nvidia.com/deploy/xid-errors): the ones whose action is a GPU reset, a node reboot
or a field diagnosis. Xids that an application causes (13, 31, 43, 45) are kept as events but are
not evidence against the node.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

KMSG = "/dev/kmsg"
KEEP = 16  # the newest Xids seen since the agent started, carried in every sample

# code -> what NVIDIA's catalogue calls it, for the Xids that are evidence against the node
HARDWARE_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    64: "ECC row-remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)\): (\d+),\s*(.*)"
)


def parse_record(record: str) -> dict[str, Any] | None:
    """One /dev/kmsg record ("prio,seq,usec,flags;message", continuation lines after it) as an Xid
    event {"code", "pci", "text", "seq"}, or None when it is no Xid line."""
    head, sep, message = record.partition(";")
    if not sep:
        head, message = "", record
    m = _XID.search(message.splitlines()[0] if message else "")
    if not m:
        return None
    fields = head.split(",")
    seq = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else -1
    return {"code": int(m.group(2)), "pci": m.group(1), "text": m.group(3).strip()[:200], "seq": seq}


def xid_events(records: Iterable[str]) -> list[dict[str, Any]]:
    """The Xid events among kernel-log records, in order."""
    return [e for e in map(parse_record, records) if e is not None]


class XidReader:
    """Reads new kernel-log records on each call, never blocking; keeps the newest KEEP Xids."""

    def __init__(self, path: str = KMSG):
        self.path = path
        self.events: list[dict[str, Any]] = []
        self.reason = ""
        self._fd = -1
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self._fd, 0, os.SEEK_END)  # from now on: an earlier Xid is not this run's
        except OSError as err:
            self.close()
            self.reason = f"kernel log not readable ({path}: {err.strerror or err})"

    @property
    def ok(self) -> bool:
        return self._fd >= 0

    def read(self) -> list[dict[str, Any]]:
        """Every Xid seen since the reader opened, newest last (at most KEEP)."""
        records: list[str] = []
        while self._fd >= 0 and len(records) < 10_000:
            try:
                data = os.read(self._fd, 8192)  # one record per read
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue  # records were overwritten before this read; the next read goes on
            except OSError as err:
                self.close()
                self.reason = f"kernel log read failed ({self.path}: {err.strerror or err})"
                break
            if not data:
                break
            records.append(data.decode("utf-8", "replace"))
        if records:
            self.events = (self.events + xid_events(records))[-KEEP:]
        return self.events

    def sample(self) -> dict[str, Any]:
        """The agent line's "xid" field."""
        events = self.read()
        return {"ok": self.ok, "reason": self.reason, "events": events}

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
