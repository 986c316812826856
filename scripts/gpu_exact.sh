#!/usr/bin/env bash
# The exact-arithmetic (L2) run on one H200, in two stages that share one warm machine
# (Triton's cache lives in /tmp between them):
#
#   scripts/gpu_exact.sh check OUT   # compile every variant; L2 tests, SASS checks,
#                                    # captures for scripts/capture_exact.py, the cost of exact
#   scripts/gpu_exact.sh suite OUT   # the whole GPU suite (on the warm cache)
#
# Logs go to OUT/<stage>/ and are packed into OUT/<stage>.tgz; summaries come last.
set -uo pipefail
STAGE=${1:?usage: scripts/gpu_exact.sh check|suite OUT}
OUT=${2:?usage: scripts/gpu_exact.sh STAGE OUT}
cd "$(dirname "$0")/.."
LOG="$OUT/$STAGE"
mkdir -p "$LOG"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/dash_triton_cache
export DASH_GIT_REV=${DASH_GIT_REV:-unknown}  # the device copy has no .git: pass it in
PY=python3
NPROC=$(nproc)

step() {  # step NAME SECONDS CMD...: time-limited, logged; a failure is reported, not fatal
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($(date +%T)): $*"
    timeout --kill-after=10 "$limit" "$@" > "$LOG/$name.log" 2>&1
    echo "=== $name: exit $?"
}

case "$STAGE" in
check)
    step warmup 280 $PY -m dash_cuda.warmup --processes "$NPROC" --dtypes bf16 fp16 \
        --head-dims 16 32 64 128 --audit --exact
    step l2 150 $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout=120 \
        tests/gpu/test_cuda_exact.py tests/test_exact_asm.py
    step capture 30 $PY scripts/capture_exact.py capture "$LOG/capture"
    step bench 120 $PY benchmarks/bench_exact.py --out "$LOG" --processes "$NPROC"
    tail -n 1 "$LOG/warmup.log"
    tail -n 5 "$LOG/l2.log"
    [ -f "$LOG/exact_cost.md" ] && sed -n '/^| d/,$p' "$LOG/exact_cost.md"
    ;;
suite)
    step tests 560 $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout=120 \
        tests/gpu tests/test_cuda_inputs.py tests/test_exact_asm.py
    grep -E "^(FAILED|ERROR)" "$LOG/tests.log" | head -n 20
    tail -n 2 "$LOG/tests.log"
    ;;
esac
tar czf "$OUT/$STAGE.tgz" -C "$OUT" "$STAGE"
