#!/usr/bin/env bash
# The release run on one H200, in stages that share one warm machine (Triton's cache and
# the FlashAttention-4 bundle live in /tmp between stages):
#
#   scripts/gpu_release.sh compile OUT   # pre-compile every kernel variant; MMA model check
#   scripts/gpu_release.sh measure OUT   # the benchmark grid
#   scripts/gpu_release.sh audit OUT     # GPU tests, then the determinism report
#   scripts/gpu_release.sh exact OUT     # L2 tests, captures for capture_exact.py, the
#                                        # cost of exact=True
#   scripts/gpu_release.sh suite OUT     # the whole GPU suite alone
#
# Each stage writes its logs to OUT/<stage>/ and packs them into OUT/<stage>.tgz; the
# short tables come last on stdout.
set -uo pipefail
STAGE=${1:?usage: scripts/gpu_release.sh compile|measure|audit|exact|suite OUT}
OUT=${2:?usage: scripts/gpu_release.sh STAGE OUT}
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
    local rc=$?
    echo "=== $name: exit $rc"
    return $rc
}

fa4_unpack() {
    [ -d /tmp/site ] && return 0
    if [ -f /tmp/part_aa ] && [ -f .fa4b/part_ab ]; then
        cat /tmp/part_aa .fa4b/part_ab | xz -d | tar x -C /tmp && echo "FA4 unpacked"
    else
        echo "FA4 bundle not here (part_aa: $([ -f /tmp/part_aa ] && echo yes || echo no))"
    fi
}

case "$STAGE" in
compile)
    [ -f .fa4a/part_aa ] && cp .fa4a/part_aa /tmp/ && echo "part_aa staged"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv \
        > "$LOG/environment.log" 2>&1
    step warmup 240 $PY -m dash_cuda.warmup --processes "$NPROC" --dtypes bf16 fp16 \
        --head-dims 16 32 64 128 --audit --exact
    step mma 240 $PY scripts/validate_mma.py --out "$LOG/mma" --jobs "$NPROC"
    tail -n 2 "$LOG/warmup.log"
    tail -n 40 "$LOG/mma.log"
    ;;
measure)
    fa4_unpack
    step bench 370 $PY benchmarks/bench_attention.py --out "$LOG" --processes "$NPROC" \
        --time-budget 330
    [ -f "$LOG/bench_attention.md" ] && sed -n '/## The gap/,/## Forward/p' \
        "$LOG/bench_attention.md"
    ;;
audit)
    fa4_unpack
    step tests 200 $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout=120 \
        tests/gpu tests/test_cuda_inputs.py tests/test_exact_asm.py
    step determinism 380 $PY benchmarks/determinism_report.py --out "$LOG" \
        --long-trials 1000 --trials 20
    tail -n 3 "$LOG/tests.log"
    grep -E "^(FAILED|ERROR)" "$LOG/tests.log" | head -n 20
    grep -E "repeatable|ERROR" "$LOG/determinism.log" | tail -n 70
    ;;
exact)
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
*)
    echo "unknown stage $STAGE" >&2
    exit 2
    ;;
esac
tar czf "$OUT/$STAGE.tgz" -C "$OUT" "$STAGE"
