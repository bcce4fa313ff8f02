#!/usr/bin/env bash
# Runs the checks, then the whole test suite. Tests that need sshd or tmux start them themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
export DS_ACCELERATOR=cpu
SOURCES=(taehv_console trainer tests benchmarks scripts)
echo "== ruff format --check"
.venv/bin/ruff format --check -q "${SOURCES[@]}"
echo "== ruff check"
.venv/bin/ruff check -q "${SOURCES[@]}"
echo "== mypy (taehv_console, trainer: [tool.mypy] in pyproject.toml)"
.venv/bin/mypy
echo "== pytest"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@" tests
