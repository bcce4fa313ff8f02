"""The reaper in tests/conftest.py, proven on a pytest session of its own: what a test starts is
ended when the test times out (pytest-timeout's signal method: teardown; its thread method, which
calls os._exit: the guardian), and a process that escaped the registry fails the session."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.timeout(180)]


def _alive_with(token: str) -> list[str]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if token in cmd and state != "Z":
            out.append(f"{name}: {cmd}")
    return out


def _session(tmp_path: Path, body: str, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    token = f"reaper-probe-{uuid.uuid4().hex}"
    (tmp_path / "test_probe.py").write_text(
        textwrap.dedent(
            f"""
            import os, subprocess, sys, time
            import pytest
            SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)", "{token}"]
            SHELL = " ".join(SLEEPER[:2]) + " 'import time; time.sleep(600)' {token}"
            """
        )
        + textwrap.dedent(body)
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q"]
        + ["--basetemp", str(tmp_path / "basetemp"), "--rootdir", str(tmp_path), *args, "test_probe.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=150,
    )
    return proc, token


def _gone(token: str, within: float) -> list[str]:
    deadline = time.monotonic() + within
    while (left := _alive_with(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


STARTS_AND_HANGS = """
@pytest.mark.timeout(3)
def test_hangs():
    subprocess.Popen(SLEEPER, start_new_session=True)  # a group of its own
    subprocess.Popen(["sh", "-c", SHELL + " & " + SHELL])  # in pytest's group, with a child
    time.sleep(120)
"""


def test_a_test_that_times_out_has_its_processes_ended_at_teardown(tmp_path):
    proc, token = _session(tmp_path, STARTS_AND_HANGS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Timeout" in proc.stdout
    assert "reaper: processes tests left behind" in proc.stdout, proc.stdout
    assert _gone(token, 5) == []


def test_a_session_that_dies_in_a_timeout_has_its_processes_ended_by_the_guardian(tmp_path):
    proc, token = _session(tmp_path, STARTS_AND_HANGS, "--timeout-method=thread")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert _gone(token, 30) == [], proc.stderr
    assert "ended without tearing down" in proc.stderr


def test_a_process_that_escapes_the_registry_fails_the_session(tmp_path):
    body = """
    def test_leaks():
        os.system("setsid " + SHELL + " &")  # not through subprocess.Popen
        time.sleep(0.5)
    """
    proc, token = _session(tmp_path, body)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert "LEAKED PROCESSES" in proc.stdout and token in proc.stdout, proc.stdout
    assert _gone(token, 5) == []
