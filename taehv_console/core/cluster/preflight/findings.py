"""The preflight checks' severities (E, W, I) and the order a report shows their findings in:
errors first, then by node and id."""

from __future__ import annotations

from collections.abc import Sequence

from taehv_console.core.models import Finding, Severity

E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO


def sort_findings(findings: Sequence[Finding]) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: (f.severity.rank, f.node or "", f.id)))
