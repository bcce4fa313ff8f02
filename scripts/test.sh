#!/usr/bin/env bash
# Runs the whole test suite. Tests that need sshd or tmux start them themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
export DS_ACCELERATOR=cpu
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@" tests
