#!/usr/bin/env bash
# One command for the GPU machine: compile every kernel variant, show what the compiler made
# of the arithmetic contract, run the GPU tests, run the backward benchmark. Full logs go to
# the folder given as the first argument; a short summary is printed last.
#
#   scripts/gpu_check.sh LOGDIR [quick]
#
# "quick" runs the benchmark on a reduced grid (S = 1024 and 8192 only).
set -uo pipefail
LOG=${1:?usage: scripts/gpu_check.sh LOGDIR [quick]}
MODE=${2:-full}
cd "$(dirname "$0")/.."
mkdir -p "$LOG"
LOG=$(cd "$LOG" && pwd)
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/dash_triton_cache}
PY=${PYTHON:-python3}
NPROC=$(nproc)
status=0

step() {  # step NAME TIMEOUT_SECONDS COMMAND...: run with a time limit, log, remember failures
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > "$LOG/$name.log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" -eq 0 ] || status=1
    return $rc
}

{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
        --format=csv
    $PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__,
"cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
} > "$LOG/environment.log" 2>&1
cat "$LOG/environment.log"

step warmup 300 $PY -m dash_cuda.warmup --processes "$NPROC" --dtypes bf16 fp16 \
    --head-dims 16 32 64 128 --audit
tail -n 1 "$LOG/warmup.log"
step inspect_asm 120 $PY -m dash_cuda.backends.triton.inspect_asm "$LOG/asm"
# a first, short look: if the persistent kernel hangs or fails here, stop before the rest
if ! step smoke 120 $PY -m pytest -q -x -p no:cacheprovider \
        tests/gpu/test_cuda_correctness.py -k "pinned_workers or autograd"; then
    tail -n 40 "$LOG/smoke.log"
    exit 1
fi
step tests 360 $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout=120 \
    tests/gpu tests/test_cuda_inputs.py
if [ "$MODE" = quick ]; then
    BENCH_ARGS=(--seqlens 1024 8192)
else
    BENCH_ARGS=()
fi
step bench 360 $PY benchmarks/bench_backward.py --out "$LOG" --processes "$NPROC" \
    "${BENCH_ARGS[@]}"

echo
echo "===================== summary ====================="
grep -E "registers|PTX|SASS" "$LOG/inspect_asm.log" | cut -c1-400
tail -n 3 "$LOG/tests.log"
grep -E "^(FAILED|ERROR)" "$LOG/tests.log" | head -n 20
[ -f "$LOG/bench_backward.md" ] && cat "$LOG/bench_backward.md"
exit $status
