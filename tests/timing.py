"""A pytest plugin (registered by tests/conftest.py): where the suite's time goes: every test's duration (setup, call and teardown together) and
outcome, written as JSON when the session ends, for `scripts/test_report.py` to sum up.

`scripts/test.sh` runs the suite as two pytest sessions at once (tiers, see there); each writes
`$TAEHV_TEST_OUTPUT/timing-<tier>.json` (default `test-output/`, tier `all`). A plain `pytest` run
writes it too, so a slow test shows up in the change that adds it.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

_DURATIONS: dict[str, float] = defaultdict(float)
_OUTCOMES: dict[str, str] = {}
_STARTED = time.monotonic()


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
    doc = {
        "tier": tier,
        "wall_s": round(time.monotonic() - _STARTED, 1),
        "tests": {
            nodeid: {"s": round(s, 3), "outcome": _OUTCOMES.get(nodeid, "error")}
            for nodeid, s in _DURATIONS.items()
        },
    }
    path.write_text(json.dumps(doc, indent=0) + "\n")
