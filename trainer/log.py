"""The trainer's logger: one `[taehv-train]` line per record, written with the rank in mind.

Records go to stdout below WARNING and to stderr from WARNING up (the launcher's logs keep the two
apart, and the console's log scan reads both). By default only rank 0 writes, so a message is not
repeated once per process; `every_rank=True` keeps a rank's own news (a skipped video, its error).
"""

from __future__ import annotations

import logging
import sys

NAME = "taehv-train"


class _RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        return self.rank == 0 or bool(getattr(record, "every_rank", False))


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING


class RankLogger:
    """`info`/`warning`/`error` with the trainer's prefix; rank 0 only unless `every_rank`."""

    def __init__(self, rank: int = 0):
        self.rank = rank
        self._log = logging.getLogger(NAME)
        self._log.propagate = False
        self._log.setLevel(logging.INFO)
        for handler in list(self._log.handlers):  # one configuration per process: the latest rank's
            self._log.removeHandler(handler)
        fmt = logging.Formatter("[taehv-train] %(message)s")
        out = logging.StreamHandler(sys.stdout)
        out.addFilter(_BelowWarning())
        err = logging.StreamHandler(sys.stderr)
        err.setLevel(logging.WARNING)
        for handler in (out, err):
            handler.setFormatter(fmt)
            handler.addFilter(_RankFilter(rank))
            self._log.addHandler(handler)

    def info(self, message: str, *, every_rank: bool = False) -> None:
        self._log.info(message, extra={"every_rank": every_rank})

    def warning(self, message: str, *, every_rank: bool = False) -> None:
        self._log.warning(message, extra={"every_rank": every_rank})

    def error(self, message: str) -> None:
        """Every rank says its own error."""
        self._log.error(message, extra={"every_rank": True})
