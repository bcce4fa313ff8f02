"""stdout's reader goes away (`taehv-console status --json | head`): no traceback, no crash log, no
"Exception ignored" at exit; the command's own code when its work was done, 141 when the closed
pipe cut it short. Real processes, a pipe whose read end is closed before they write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from taehv_console.exit_codes import ExitCode

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "cpu-smoke-done"
BIN = Path(sys.executable).parent


def run_with_closed_stdout(argv: list[str], crash_dir: Path) -> subprocess.CompletedProcess:
    read, write = os.pipe()
    os.close(read)  # nobody will read: the first write(2) to it is EPIPE
    try:
        env = {**os.environ, "TAEHV_CRASH_DIR": str(crash_dir)}
        return subprocess.run(
            [str(BIN / "taehv-console"), *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=120,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--runs", "{runs}", "--json"],  # JSON: print() to a pipe, cut short mid-list
        ["status", "{runs}/run-00"],  # text through rich, which answers a broken stdout itself
        ["presets"],
    ],
)
def test_a_closed_stdout_is_neither_a_crash_nor_a_traceback(tmp_path, argv):
    runs = tmp_path / "runs"
    for i in range(40):
        shutil.copytree(FIXTURE, runs / f"run-{i:02d}")
    crashes = tmp_path / "crashes"
    done = run_with_closed_stdout([a.format(runs=runs) for a in argv], crashes)
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert not crashes.exists() or not any(crashes.iterdir()), done.stderr
    # not 1 (rich's own answer), which platforms retry and status uses for a bad checkpoint
    assert done.returncode == ExitCode.OUTPUT_CLOSED == 141, (done.returncode, done.stderr)


def test_every_commands_help_lists_the_closed_stdout_code():
    done = subprocess.run(
        [str(BIN / "taehv-console"), "status", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "  141  stdout's reader went away" in done.stdout, done.stdout
