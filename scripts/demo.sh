#!/usr/bin/env bash
# The embedded default: generate a few synthetic clips and train TAEHV on this machine with the
# cpu-smoke preset (2 CPU processes, DeepSpeed ZeRO-2 over gloo). Output lands in demo/run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
DEMO="${DEMO_DIR:-demo}"
if [ ! -d "$DEMO/clips" ]; then
  "$BIN/taehv-train" make-synthetic "$DEMO/clips" --clips 12 --frames 16 --size 64x64
fi
rm -rf "$DEMO/run"
"$BIN/taehv-console" render --preset cpu-smoke --out "$DEMO/run" --set "data.source=\"$PWD/$DEMO/clips\"" --main-ip 127.0.0.1
"$BIN/accelerate" launch --config_file "$DEMO/run/accelerate-node-0.yaml" -m trainer.cli --run "$PWD/$DEMO/run"
echo "done: weights in $DEMO/run/final/taehv.safetensors, TensorBoard logs in $DEMO/run/tensorboard"
