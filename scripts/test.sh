#!/usr/bin/env bash
# Installs the Debian packages some tests need where it can (scripts/system-deps.sh), runs the
# checks, then the whole test suite; pytest's summary (-ra) lists every skip with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export DS_ACCELERATOR=cpu
bash scripts/system-deps.sh
SOURCES=(taehv_console trainer tests benchmarks scripts)
echo "== ruff format --check"
.venv/bin/ruff format --check -q "${SOURCES[@]}"
echo "== ruff check"
.venv/bin/ruff check -q "${SOURCES[@]}"
echo "== mypy (taehv_console, trainer: [tool.mypy] in pyproject.toml)"
.venv/bin/mypy
echo "== pytest"
# the slowest tests are listed at the end: where the suite's time goes (aim: 25 min in CI)
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=60 "$@" tests
