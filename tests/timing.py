"""A pytest plugin (registered by tests/conftest.py): where the suite's time goes: every test's duration (setup, call and teardown together), its
CPU time and its outcome, written as JSON when the session ends, for `scripts/test_report.py` to sum up.

A test's CPU time is that of the pytest process and of the processes it started and waited for (a
run's launcher and its ranks, ssh, a console), all cores together; a daemon it left to others (the
supervisor, a session-wide sshd) is not counted. Far less CPU than wall time is a test that waits;
about 2x its wall time is one that keeps both cores of a 2-core machine busy. The machine's own
busy time over the session (/proc/stat, every process) is written beside it: what share of the
cores the run left idle.

`scripts/test.sh` runs the suite as two pytest sessions at once (tiers, see there); each writes
`$TAEHV_TEST_OUTPUT/timing-<tier>.json` (default `test-output/`, tier `all`). A plain `pytest` run
writes it too, so a slow test shows up in the change that adds it.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

_DURATIONS: dict[str, float] = defaultdict(float)
_CPU: dict[str, float] = defaultdict(float)
_OUTCOMES: dict[str, str] = {}
_STARTED = time.monotonic()


def cpu_s() -> float:
    """User + system seconds of this process and of its waited-for descendants."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def machine_cpu_s() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, all cores (Linux /proc/stat)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields) - idle) / tick, sum(fields) / tick


_MACHINE_AT_START = machine_cpu_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    before = cpu_s()
    yield
    _CPU[item.nodeid] += cpu_s() - before


def output_dir() -> Path:
    return Path(os.environ.get("TAEHV_TEST_OUTPUT", "test-output"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _DURATIONS[report.nodeid] += report.duration
    # the worst phase wins: a failed teardown fails a test whose call passed
    if report.failed:
        _OUTCOMES[report.nodeid] = "error" if report.when != "call" else "failed"
    elif report.skipped:
        _OUTCOMES.setdefault(report.nodeid, "skipped")
    elif report.when == "call":
        _OUTCOMES.setdefault(report.nodeid, "passed")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _DURATIONS:
        return
    tier = os.environ.get("TAEHV_TEST_TIER", "all")
    out = output_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"timing-{tier}.json"
    doc: dict[str, object] = {
        "tier": tier,
        "wall_s": round(time.monotonic() - _STARTED, 1),
        "tests": {
            nodeid: {
                "s": round(s, 3),
                "cpu_s": round(_CPU.get(nodeid, 0.0), 3),
                "outcome": _OUTCOMES.get(nodeid, "error"),
            }
            for nodeid, s in _DURATIONS.items()
        },
    }
    now = machine_cpu_s()
    if _MACHINE_AT_START is not None and now is not None:
        doc["machine"] = {
            "busy_s": round(now[0] - _MACHINE_AT_START[0], 1),
            "total_s": round(now[1] - _MACHINE_AT_START[1], 1),
            "cores": os.cpu_count(),
        }
    path.write_text(json.dumps(doc, indent=0) + "\n")
