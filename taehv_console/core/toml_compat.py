"""`tomllib` on Python 3.11+, its backport `tomli` on 3.10 (declared in pyproject for < 3.11):
the one place that choice is made for the console's TOML readers."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = ["tomllib"]
