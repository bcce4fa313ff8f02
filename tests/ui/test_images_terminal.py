"""The image widgets' module (ui/images.py) asks the terminal about itself when imported. A terminal
that reports a size of 0×0, as `docker exec -it` and `kubectl exec -it` do before their first
resize, must not stop the console from starting."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _import_on_a_terminal_of_no_size(module: str) -> subprocess.CompletedProcess:
    leader, follower = pty.openpty()
    try:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
        return subprocess.run(
            [sys.executable, "-c", f"import {module}"],
            stdin=follower,
            stdout=follower,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
    finally:
        os.close(follower)
        os.close(leader)


@pytest.mark.parametrize(
    ("module", "imports"),
    [("textual_image.widget", False), ("taehv_console.ui.images", True)],
    ids=["textual-image-alone", "the-console"],
)
def test_a_terminal_of_no_size(module, imports):
    r = _import_on_a_terminal_of_no_size(module)
    if imports:
        assert r.returncode == 0, r.stderr[-2000:]
    else:  # what the console's guard is for: textual-image alone divides by the 0 columns
        assert r.returncode != 0 and "ZeroDivisionError" in r.stderr
