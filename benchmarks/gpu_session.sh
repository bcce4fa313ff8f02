#!/usr/bin/env bash
# One lent GPU, one call, every figure the standing order asks for, inside BUDGET_S seconds
# (default 540). Run from the repository root on the GPU machine:
#
#   OUT=/some/dir bash benchmarks/gpu_session.sh
#
# Wheels for what the machine's image lacks (deepspeed, av, pydantic, ...: docs/performance.md) are
# installed from .whl/ when it is there. Everything lands in $OUT, in at most 8 files:
#   results.jsonl   gpu_throughput.py's JSON lines, every part appended
#   session.log     everything printed
#   nvml.jsonl      three raw lines of the node agent on this GPU (a recorded real NVML sample)
#   fr.tar.gz       benchmarks/nccl_forensics.py's Flight Recorder dumps, analysis and rank logs
#   profileN.json.gz the profiled steps' Chrome traces
# Each part has its own share of the budget, so a slow part costs only its own share. STEPS picks
# parts for a follow-up call, e.g. STEPS="eager:25 compiled:30" (part:percent of BUDGET_S).
set -u
OUT=${OUT:?set OUT to a folder for the results}
BUDGET_S=${BUDGET_S:-540}
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
exec > >(tee -a "$OUT/session.log") 2>&1

if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - start))); }
# share N: N percent of the whole budget, or what is left if that is less
share() { local want=$((BUDGET_S * $1 / 100)) l; l=$(left); echo $((want < l ? want : l)); }
tp() { $PY benchmarks/gpu_throughput.py --out "$OUT" "$@"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
# The parts, in the order they run; STEPS picks some (a follow-up call), each with its share in %.
eager() { # peak rates and the bare loop, eager, both layouts (max batch searched in the presets' layout)
    tp --only env,matmul,grid --modes eager --batches 8,max --time-limit-s "$(share "$1")"
}
trainer() { # the real trainer as the GPU presets run it: ZeRO-2, channels_last, compiled
    tp --only trainer --zero 2 --trainer-compile --trainer-batch 8 --time-limit-s "$(share "$1")"
}
compiled() { # the bare loop compiled in the presets' layout, reconstruction and distillation on cached
    # teacher latents (one compile serves both), and one compiled step profiled
    tp --only grid,profile --layouts channels_last --modes compile --batches 8 --step recon,distill \
        --profile-mode compile --profile-batch 8 --time-limit-s "$(share "$1")"
}
inputs() { # where an eager step's time goes, the input path, the 64x64 crop recipe
    tp --only profile,input,crop --time-limit-s "$(share "$1")"
}
autotune() { # compiled with max-autotune (Triton conv templates against cuDNN, ReLU fused into them);
    # not in the default list: its compile alone may take minutes (a follow-up: STEPS="autotune:100")
    local s; s=$(share "$1")
    timeout "$s" $PY benchmarks/gpu_throughput.py --out "$OUT" --only grid --layouts channels_last \
        --modes compile --batches 8 --compile-mode max-autotune-no-cudagraphs --time-limit-s "$s"
}
compilecache() { # a compiled run's first step on an empty Inductor cache: cold, from the run's
    # compile cache, and on a warm machine (three trainer processes, about 3 minutes; a follow-up:
    # STEPS="compilecache:100")
    local s; s=$(share "$1")
    timeout "$s" $PY benchmarks/compile_cache.py --device cuda --out "$OUT" --timeout-s "$((s / 2))"
}
zero3() { # the trainer at the 16/48/64-GPU presets' ZeRO-3, eager then compiled: DeepSpeed's gather
    # hooks on every module break each compiled stage (on CPU the compiled step was the slower one);
    # a follow-up: STEPS="zero3:100"
    local half=$(($1 / 2))
    tp --only trainer --zero 3 --trainer-batch 8 --time-limit-s "$(share "$half")"
    tp --only trainer --zero 3 --trainer-compile --trainer-batch 8 --time-limit-s "$(share "$half")"
}
convs() { # every convolution of a step timed alone, and padded to 8 channels where it is not
    timeout "$(share "$1")" $PY benchmarks/conv_shapes.py --out "$OUT"
}
decoders() { # NVDEC through PyAV's own FFmpeg against its CPU decode, on 1080p H.264 (the wheel, no torchcodec)
    timeout "$(share "$1")" $PY benchmarks/decoders.py --sets 1920x1080-60f --make 1 --clips 12
}
forensics() { # NVML as the node agent reads it (and the live NVML test), NCCL's Flight Recorder on a hang
    timeout 15 $PY -m taehv_console.core.watch.agent --interval 0.5 --count 3 > "$OUT/nvml.jsonl" < /dev/null
    if $PY -c "import pytest" 2> /dev/null; then
        timeout 60 $PY -m pytest -q -rA -p no:cacheprovider tests/core/watch/test_agent.py -k live_nvml
    else
        echo "pytest does not import: the live NVML test was not run (its wheels: docs/performance.md)"
    fi
    timeout "$(share "$1")" $PY benchmarks/nccl_forensics.py "$OUT/work" --timeout-s 10
    tar -C "$OUT/work" -czf "$OUT/fr.tar.gz" fr 2> /dev/null
    rm -rf "$OUT/work"
}
for step in ${STEPS:-eager:18 trainer:22 compiled:22 inputs:14 convs:8 decoders:8 forensics:8}; do
    "${step%%:*}" "${step##*:}"
done
n=0
for t in "$OUT"/profile_*.json; do
    [ -f "$t" ] && n=$((n + 1)) && gzip -c "$t" > "$OUT/profile$n.json.gz" && rm -f "$t"
done
echo "session done in $(( $(date +%s) - start )) s"
