"""The suite's own timing (tests/timing.py, scripts/test_report.py): each test's wall and CPU time,
and how busy the machine was, measured on a real pytest session of two tests: one that keeps a
child process busy and one that waits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TESTS = textwrap.dedent(
    """
    import subprocess, sys, time

    def test_busy_child():
        # a child that spins for 0.6 s of CPU, waited for: its time is the test's
        subprocess.run([sys.executable, "-c",
            "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6: pass"], check=True)

    def test_waits():
        time.sleep(0.6)
    """
)


def test_each_test_has_its_cpu_time_and_the_report_shows_it(tmp_path):
    (tmp_path / "test_two.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TAEHV_TEST_OUTPUT": str(out), "TAEHV_TEST_TIER": "t"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.timing", "-c", str(tmp_path / "pytest.ini")]
    done = subprocess.run(
        [*argv, "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((out / "timing-t.json").read_text())
    tests = {k.rsplit("::", 1)[1]: v for k, v in doc["tests"].items()}
    busy, waits = tests["test_busy_child"], tests["test_waits"]
    assert busy["outcome"] == waits["outcome"] == "passed", tests
    assert busy["cpu_s"] >= 0.5, busy  # the child's 0.6 s counted
    assert waits["s"] >= 0.6 and waits["cpu_s"] < 0.3, waits  # waiting is wall time, not CPU
    machine = doc["machine"]
    assert machine["cores"] == os.cpu_count() and 0 < machine["busy_s"] <= machine["total_s"], machine

    report = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "test_report.py"), "--dir", str(out), "--wall-s", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert report.returncode == 0, report.stderr
    assert "suite: 2 passed, 0 failed, 0 skipped" in report.stdout, report.stdout
    assert "CPU-s in the tests' own processes" in report.stdout and "% busy" in report.stdout, report.stdout
    durations = (out / "durations.txt").read_text()
    row = next(line for line in durations.splitlines() if line.endswith("::test_busy_child"))
    wall, cpu = (float(v) for v in row.split()[:2])
    assert cpu >= 0.5 and wall >= cpu / os.cpu_count(), row
