#!/usr/bin/env bash
# The main job on the embedded default: the console on this machine. Without GPUs and without
# --data it trains the cpu-smoke preset (2 CPU processes, DeepSpeed ZeRO-2 over gloo) on generated
# clips. In a terminal it opens the console (wizard, then dashboard); otherwise it runs headless.
set -euo pipefail
cd "$(dirname "$0")/.."
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
RUNS="${DEMO_RUNS:-demo/runs}"
if [ -t 0 ] && [ -t 1 ]; then
  exec .venv/bin/taehv-console --runs "$RUNS" "$@"
fi
exec .venv/bin/taehv-console --no-tui --runs "$RUNS" "$@"
