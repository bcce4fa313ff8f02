#!/usr/bin/env bash
# Installs the Debian packages some tests need where it can (scripts/system-deps.sh), runs the
# checks, then the whole test suite; pytest's summary (-ra) lists every skip with its reason.
#
# With no arguments the suite runs as three pytest sessions at once, so that the cores one leaves
# idle (a run starting, a test waiting on a process, a socket or a heartbeat) do the others' work on
# a 2-core machine: the `trainer` tier (tests/trainer: the trainer's DeepSpeed runs), printed as it
# goes; the `e2e` tier (tests/e2e and tests/slurm: whole runs through the console, over sshd and the
# SLURM cluster, then `eval`'s tests and the cpu-smoke preset's learning run on photo clips) and
# the `console` tier (everything else: the console's units, the TUI, then the trainer tests that
# mostly wait; mypy beside them), each printed when it ends. Each keeps its own temp dir and sshd.
# Arguments go to one plain pytest session instead, e.g. `bash scripts/test.sh tests/core -x`.
# At the end: the suite's wall time, its ten slowest tests, one closing count line for every tier,
# and test-output/durations.txt (the slowest 30 tests, the time per directory).
set -uo pipefail
cd "$(dirname "$0")/.."
export DS_ACCELERATOR=cpu
bash scripts/system-deps.sh || exit 1
started=$SECONDS
SOURCES=(taehv_console trainer tests benchmarks scripts)
# Three sessions at once. The trainer tier (tests/trainer: DeepSpeed runs) is busy; the e2e tier
# (tests/e2e, tests/slurm: whole runs driven through the console, sshd and the SLURM cluster) and the
# console tier (everything else) mostly wait on processes, sockets and heartbeats. With the e2e tests
# inside the console tier, its waits alone made it the longest session (1614 s of the suite's 1622 s
# wall, f0227f4's CI); split, each waits beside the others' work.
# The e2e tier ends with the cpu-smoke preset's learning run on photo clips (CPU-bound; the one on
# generated clips is tests/e2e/test_headless.py's, the README's first command as shipped).
# Without the learning runs it ended ~440 s before the trainer tier, which then ran alone on
# 1-1.5 cores (1547 s wall against 1111 and 1104 for the others, 90 % busy, in the first
# three-session CI run).
# tests/trainer/test_evaluate.py joined it when the e2e runs took one micro-batch a step
# (tests/e2e/consoles.py, SMALL_RUN): the e2e tier then ended 220 s before the trainer tier
# (4fd9572's CI: console 1464 s, e2e 1368, trainer 1591; the file: ~90 s of wall, 60 CPU-s).
E2E_TIER=(tests/e2e tests/slurm tests/trainer/test_evaluate.py tests/trainer/test_smoke_learns.py)
# Trainer tests that mostly wait (on heartbeats, timeouts, a second process's compile) end the
# console tier instead: it ended ~520 s before the trainer tier, which then ran alone at 1-1.7 busy
# cores for its last ~4 minutes (a147333's CI: console 1113 s, e2e 1367 s, trainer 1631 s; these two
# files: 215 s of the trainer tier's wall for 99 CPU-s).
# test_universal.py (~65 s of wall, 85 CPU-s) joined them for two runs and went back: the console
# tier then ended last, by 70-150 s (9ed1ac0's CI: console 1464 s, e2e 1396, trainer 1318).
CONSOLE_EXTRA=(tests/trainer/test_compile_cache.py tests/trainer/test_heartbeats.py)
TRAINER_TIER=(tests/trainer)
trainer_ignore=()
for p in "${E2E_TIER[@]}" "${CONSOLE_EXTRA[@]}"; do [[ $p == tests/trainer/* ]] && trainer_ignore+=(--ignore="$p"); done
export TAEHV_TEST_OUTPUT=${TAEHV_TEST_OUTPUT:-$PWD/test-output}
rm -rf "$TAEHV_TEST_OUTPUT"
mkdir -p "$TAEHV_TEST_OUTPUT"
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider)

echo "== ruff format --check"
.venv/bin/ruff format --check -q "${SOURCES[@]}" || exit 1
echo "== ruff check"
.venv/bin/ruff check -q "${SOURCES[@]}" || exit 1

if [ $# -gt 0 ]; then
    echo "== mypy (taehv_console, trainer: [tool.mypy] in pyproject.toml)"
    .venv/bin/mypy || exit 1
    echo "== pytest $*"
    "${PYTEST[@]}" --durations=30 "$@"
    rc=$?
    .venv/bin/python scripts/test_report.py --dir "$TAEHV_TEST_OUTPUT" --wall-s $((SECONDS - started))
    exit $rc
fi

# Scratch for the tests' run directories: each writes ~0.7 GB of checkpoints and syncs them to
# disk, ~70 GB a session. In memory (/dev/shm, a tmpfs) that costs less: tests/trainer/test_training.py
# took 250.6 s and 298 CPU-s with its base temp on disk, 219.4 s and 268 CPU-s there (2-core AMD
# EPYC). Used when it has 8 GiB free and allows exec (passed tests' directories are removed as
# they end, failures' kept while 4 GiB is free: tests/conftest.py); TAEHV_TEST_SCRATCH names another
# place.
scratch=${TAEHV_TEST_SCRATCH:-}
if [ -z "$scratch" ]; then
    scratch=${TMPDIR:-/tmp}
    shm_free=$(df -k --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
    if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] && [ "${shm_free:-0}" -ge $((8 << 20)) ] \
        && [ -w /dev/shm ] && ! findmnt -no OPTIONS /dev/shm 2>/dev/null | grep -qw noexec; then
        scratch=/dev/shm
    fi
fi
base=$(mktemp -d "$scratch/taehv-tests.XXXXXX")
echo "== scratch: $base"
# One torch thread in every process: three sessions and their runs' ranks keep both cores busy,
# and a second thread only adds its own spinning and waking to the work. The ranks run so already
# (their launcher sets OMP_NUM_THREADS=1); the sessions' own torch work did not
# (tests/trainer/test_families.py with test_family_flops.py, A/B/A/B on a quiet 2-core AMD EPYC:
# 34.9 and 37.6 CPU-s with torch's 2 threads, 30.5 and 30.7 with one, for 27-28 s of wall against
# 30.5-30.7).
export OMP_NUM_THREADS=1
# the console tier: `tests`, less the other tiers, but with CONSOLE_EXTRA (pytest given `tests` and
# a file under it as well collects only the file: so every other entry of tests/trainer is ignored)
ignore=()
for p in "${E2E_TIER[@]}"; do ignore+=(--ignore="$p"); done
for p in tests/trainer/*; do [[ " ${CONSOLE_EXTRA[*]} " == *" $p "* ]] || ignore+=(--ignore="$p"); done
echo "== mypy, the e2e tier (${E2E_TIER[*]}) and the console tier (tests, less the other tiers, then ${CONSOLE_EXTRA[*]}) in the background"
(
    echo "== mypy (taehv_console, trainer: [tool.mypy] in pyproject.toml)"
    .venv/bin/mypy
    echo "mypy exit $?"
) > "$TAEHV_TEST_OUTPUT/mypy.log" 2>&1 &
mypy_pid=$!
TAEHV_TEST_TIER=e2e "${PYTEST[@]}" --basetemp="$base/e2e" "${E2E_TIER[@]}" > "$TAEHV_TEST_OUTPUT/e2e.log" 2>&1 &
e2e_pid=$!
TAEHV_TEST_TIER=console "${PYTEST[@]}" --basetemp="$base/console" "${ignore[@]}" tests \
    > "$TAEHV_TEST_OUTPUT/console.log" 2>&1 &
console_pid=$!
echo "== pytest, trainer tier: ${TRAINER_TIER[*]}"
TAEHV_TEST_TIER=trainer "${PYTEST[@]}" --basetemp="$base/trainer" "${trainer_ignore[@]}" "${TRAINER_TIER[@]}"
trainer_rc=$?
wait "$e2e_pid"
e2e_rc=$?
wait "$console_pid"
console_rc=$?
wait "$mypy_pid"
cat "$TAEHV_TEST_OUTPUT/mypy.log"
mypy_rc=1
grep -q "^mypy exit 0$" "$TAEHV_TEST_OUTPUT/mypy.log" && mypy_rc=0
echo "== pytest, e2e tier (ran beside the trainer tier)"
cat "$TAEHV_TEST_OUTPUT/e2e.log"
echo "== pytest, console tier (ran beside the trainer tier)"
cat "$TAEHV_TEST_OUTPUT/console.log"
if [ "$trainer_rc" -eq 0 ] && [ "$e2e_rc" -eq 0 ] && [ "$console_rc" -eq 0 ]; then
    rm -rf "$base"
else
    if [ "$scratch" = /dev/shm ]; then  # out of memory, onto disk
        kept="${TMPDIR:-/tmp}/$(basename "$base")"
        mv "$base" "$kept" 2>/dev/null && base=$kept
    fi
    echo "== the failed tests' directories are kept under $base"
fi
echo "== mypy exit $mypy_rc, trainer tier exit $trainer_rc, e2e tier exit $e2e_rc, console tier exit $console_rc"
.venv/bin/python scripts/test_report.py --dir "$TAEHV_TEST_OUTPUT" --wall-s $((SECONDS - started))
[ "$mypy_rc" -eq 0 ] && [ "$trainer_rc" -eq 0 ] && [ "$e2e_rc" -eq 0 ] && [ "$console_rc" -eq 0 ]
