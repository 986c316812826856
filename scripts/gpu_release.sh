#!/usr/bin/env bash
# The release run on one H200, in stages that share one warm machine (Triton's cache and
# the FlashAttention-4 bundle live in /tmp between stages):
#
#   scripts/gpu_release.sh compile OUT   # pre-compile every kernel variant; MMA model check
#   scripts/gpu_release.sh measure OUT   # the benchmark grid
#   scripts/gpu_release.sh audit OUT     # GPU tests, then the determinism report
#   scripts/gpu_release.sh exact OUT     # L2 tests, a capture for dash-verify reproduce, the
#                                        # cost of exact=True
#   scripts/gpu_release.sh suite OUT     # the whole GPU suite alone
#   scripts/gpu_release.sh check OUT [quick]  # one call: compile the kernels, show what the
#                                        # compiler made of the Triton arithmetic contract,
#                                        # a smoke test (the stage stops if it fails), the
#                                        # GPU tests, the benchmark grid (quick: S = 1024
#                                        # and 8192 only); exits 1 if a step failed
#
# With the CuTe backend (the FA4 bundle brings nvidia-cutlass-dsl; run ``stage`` in one call
# and the next stage in a second call within 30 s, carrying .fa4b and, if exported with
# ``python -m dash_cuda.warmup --cute-aot .cute_aot``, .cute_aot):
#
#   scripts/gpu_release.sh stage OUT     # copy the first half of the FA4 bundle to /tmp
#   scripts/gpu_release.sh verify OUT    # unpack; warm up; the whole GPU suite, both backends
#   scripts/gpu_release.sh grid OUT      # the benchmark grid
#   scripts/gpu_release.sh l2 OUT        # the MUFU tables against the hardware (all 2^32
#                                        # inputs), L2 of the default CuTe arithmetic over
#                                        # every schedule (scripts/l2_matrix.py, the captures
#                                        # tests/data/captures), the cost of the pairwise D
#   scripts/gpu_release.sh determinism OUT  # the CuTe determinism report (1000 trials per
#                                        # schedule, full and causal)
#   scripts/gpu_release.sh determinism-varlen OUT  # the same for packed batches (the
#                                        # bench_features mixes), with FA4's varlen kernels
#   scripts/gpu_release.sh train OUT [profile|small]  # the reproducible-training
#                                        # example at both sizes (small; large: attention
#                                        # 59 % of the FLOPs) against cuDNN, SDPA flash,
#                                        # FA4-det; host time of one call beside the peers
#                                        # (profile: also where a small step's time goes,
#                                        # benchmarks/training_profile.py, and the host
#                                        # primitives; small: the small model alone)
#   scripts/gpu_release.sh versus OUT [64|128]  # CuTe against FA4, interleaved rounds
#                                        # (benchmarks/versus_fa4.py; 64 or 128: that head
#                                        # dim alone, a call each)
#   scripts/gpu_release.sh features OUT [tests|bench]  # packed batches, windows, softcap and
#                                        # sinks: their GPU tests, the CuTe L2 and
#                                        # correctness tests, then benchmarks/bench_features.py
#                                        # against FA4 (varlen and windows)
#   scripts/gpu_release.sh hostpath OUT [quick]  # the tests of the call path (plans, CUDA
#                                        # graphs, sinks, compile, L2, determinism,
#                                        # correctness; quick: the first four), then host
#                                        # time of one forward + backward call beside FA4
#                                        # and SDPA (benchmarks/host_overhead.py) and the
#                                        # primitives' (benchmarks/host_costs.py)
#   scripts/gpu_release.sh headdims OUT  # the CuTe head dim 96: its GPU tests (float64,
#                                        # L0, L1, L2, windows, packed), 1000-trial L0
#                                        # report
#   scripts/gpu_release.sh headdims-versus OUT  # CuTe against FA4 at d = 96, interleaved
#   scripts/gpu_release.sh ab-roles OUT  # d = 96: the math traced per warpgroup role
#                                        # (BackwardConfig.math_per_role) against the
#                                        # shipped kernel, plain and softcap cells, bits
#                                        # compared (carry .ab_roles and .ab_roles_cap, from
#                                        # ab_backward_config.py --export, see the stage)
#   scripts/gpu_release.sh headdims-schedules OUT  # every deterministic schedule on CuTe at
#                                        # the head-dim grid's cells (96, 192 / 128, 256;
#                                        # S = 1k - 16k), beside auto and FA4, for auto's
#                                        # table (make_auto_table.py --head-dims-report)
#   scripts/gpu_release.sh headdims-wide OUT [tests|bench]  # CuTe at 192 (d_v 192, 128), 256: GPU
#                                        # tests (L2, float64, L0, auto), the Triton ones,
#                                        # the plans, the key split's L2 and packed tests;
#                                        # the anchors' cells against FA4
#   scripts/gpu_release.sh headdims-triton OUT [grid]  # head dims 96, 192 / 128, 256 on Triton:
#                                        # their GPU tests (L2 of exact, float64, L0,
#                                        # compile), the sink and plan tests, then against
#                                        # FA4 in rounds (bench_features.py --kinds headdims;
#                                        # grid: headdims-grid, S = 1k - 16k)
#   scripts/gpu_release.sh sinks OUT     # learnable sinks on the CuTe backend: its GPU tests
#                                        # (L2 of forward and backward, float64, busy-stream
#                                        # trials, the planned backward), Triton's, the
#                                        # plan tests, then against FA4 in rounds
#                                        # (bench_features.py --kinds sinks)
#   scripts/gpu_release.sh softcap OUT   # a softcap on the CuTe backend: its GPU tests (L2 of
#                                        # forward and backward, float64, busy-stream trials,
#                                        # packed), Triton's, then against FA4 in rounds
#                                        # (bench_features.py --kinds softcap)
#   scripts/gpu_release.sh pending OUT [bench|quick]  # the GPU tests written or changed since
#                                        # their last GPU run, side by side (bench: the
#                                        # softcap cell and the head-dim grid against FA4;
#                                        # quick: the tests without test_cuda_fast_l2)
#   scripts/gpu_release.sh profile OUT   # Nsight Compute on our kernels and FA4's, side by
#                                        # side (benchmarks/ncu_workload.py); CSV exports
#
# Each stage writes its logs to OUT/<stage>/ and packs them into OUT/<stage>.tgz; the
# short tables come last on stdout.
set -uo pipefail
STAGE=${1:?usage: scripts/gpu_release.sh compile|measure|audit|exact|suite|check|stage|verify|features|hostpath|l2|grid|determinism|determinism-varlen|train|versus|headdims|headdims-versus|ab-roles|headdims-schedules|headdims-wide|headdims-triton|sinks|softcap|pending|profile OUT}
OUT=${2:?usage: scripts/gpu_release.sh STAGE OUT}
MODE=${3:-full}  # check: "quick" runs the grid at S = 1024 and 8192 only; features: a half
cd "$(dirname "$0")/.."
LOG="$OUT/$STAGE"
mkdir -p "$LOG"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=/tmp/dash_triton_cache
if [ -d /tmp/site ] || [ -f .fa4b/part_ab ]; then  # CuTe DSL and FA4 from the bundle
    export PYTHONPATH="/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH"
fi
[ -d .cute_aot ] && export DASH_CUTE_AOT_DIR="$PWD/.cute_aot"
export DASH_GIT_REV=${DASH_GIT_REV:-unknown}  # the device copy has no .git: pass it in
PY=python3
NPROC=$(nproc)
status=0  # 1 once a step has failed (the exit status of ``check``)

step() {  # step NAME SECONDS CMD...: time-limited, logged; a failure is reported, not fatal
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($(date +%T)): $*"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > "$LOG/$name.log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    [ "$rc" -eq 0 ] || status=1
    return $rc
}

side_by_side() {  # side_by_side SECONDS FILE...: one pytest per test file, all at once
    local limit=$1 entry rc name
    shift
    local pids=()
    for f in "$@"; do
        name=$(basename "$f" .py)
        timeout --kill-after=10 "$limit" $PY -m pytest -q -rs -p no:cacheprovider \
            -o faulthandler_timeout=120 "$f" > "$LOG/$name.log" 2>&1 &
        pids+=("$!:$name")
    done
    for entry in "${pids[@]}"; do
        wait "${entry%%:*}"; rc=$?
        [ "$rc" -eq 0 ] || status=1
        echo "=== ${entry#*:}: exit $rc: $(tail -n 1 "$LOG/${entry#*:}.log")"
        grep -E "^(FAILED|ERROR)" "$LOG/${entry#*:}.log" | head -n 8
    done
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
        --long-trials 1000 --trials 20 --long-masks full
    tail -n 3 "$LOG/tests.log"
    grep -E "^(FAILED|ERROR)" "$LOG/tests.log" | head -n 20
    grep -E "repeatable|ERROR" "$LOG/determinism.log" | tail -n 70
    ;;
exact)
    step warmup 280 $PY -m dash_cuda.warmup --processes "$NPROC" --dtypes bf16 fp16 \
        --head-dims 16 32 64 128 --audit --exact
    step l2 150 $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout=120 \
        tests/gpu/test_cuda_exact.py tests/test_exact_asm.py
    step capture 60 $PY -m verify.cli capture --backend triton --exact --mask causal \
        --seqlen-q 250 --seqlen-k 300 --heads 2 --heads-kv 1 --out "$LOG/exact.capture"
    step bench 120 $PY benchmarks/bench_exact.py --out "$LOG" --processes "$NPROC"
    tail -n 1 "$LOG/warmup.log"
    tail -n 5 "$LOG/l2.log"
    [ -f "$LOG/exact_cost.md" ] && sed -n '/^| d/,$p' "$LOG/exact_cost.md"
    ;;
stage)
    cp .fa4a/part_aa /tmp/ && echo "part_aa staged"
    ;;
verify)
    fa4_unpack
    step warmup 120 $PY -m dash_cuda.warmup --processes "$NPROC" --dtypes bf16 fp16 \
        --head-dims 16 32 64 128 --audit --exact
    # one pytest process per file, four at a time (the suite alone outgrew one call's
    # time; the GPU and 16 cores take them side by side, as in the features stage)
    echo "=== tests ($(date +%T)): one pytest per file, 4 at a time"
    t0=$SECONDS
    : > "$LOG/exits"
    printf '%s\n' tests/gpu/test_*.py tests/test_cuda_inputs.py tests/test_exact_asm.py \
        tests/test_cute_ptx.py | xargs -P 4 -I{} sh -c 'timeout --kill-after=10 480 '"$PY"' \
        -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=120 {} \
        > "'"$LOG"'/$(basename {} .py).log" 2>&1; echo "$? {}" >> "'"$LOG"'/exits"'
    echo "=== tests: done after $((SECONDS - t0)) s"
    while read -r rc file; do
        name=$(basename "$file" .py)
        [ "$rc" -eq 0 ] || status=1
        echo "=== $name: exit $rc: $(tail -n 1 "$LOG/$name.log")"
        grep -E "^(FAILED|ERROR)" "$LOG/$name.log" | head -n 8
    done < "$LOG/exits"
    ;;
features)  # MODE "tests" or "bench": that half alone (each fits one call)
    fa4_unpack
    # the test files run side by side (they time nothing; the GPU and 16 cores take them),
    # then the benchmark alone
    if [ "$MODE" != bench ]; then
        side_by_side 420 $(ls tests/gpu/test_*varlen*.py tests/gpu/test_*window*.py \
            tests/gpu/test_*softcap*.py 2>/dev/null) tests/gpu/test_compile.py
    fi
    if [ "$MODE" != tests ]; then
        step bench 250 $PY benchmarks/bench_features.py --out "$LOG" --rounds 4 \
            --time-budget 160
        [ -f "$LOG/bench_features.md" ] && cat "$LOG/bench_features.md"
    fi
    ;;
l2)
    fa4_unpack
    step mufu 120 $PY scripts/validate_mufu.py --out "$LOG/mufu" \
        --tables dash_ref/arithmetic/mufu_tables.bin
    step matrix 360 $PY scripts/l2_matrix.py --out "$LOG" --jobs "$NPROC" \
        --keep "$LOG/captures_keep" --work /tmp/l2_captures
    step tests 300 $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout=120 \
        tests/gpu/test_cuda_fast_l2.py
    step delta 150 $PY benchmarks/bench_delta.py --out "$LOG"
    tail -n 8 "$LOG/mufu.log"
    tail -n 12 "$LOG/matrix.log"
    tail -n 5 "$LOG/tests.log"
    tail -n 30 "$LOG/delta.log"
    ;;
grid)
    fa4_unpack
    step bench 400 $PY benchmarks/bench_attention.py --out "$LOG" --processes "$NPROC" \
        --backends cute triton --time-budget 350
    [ -f "$LOG/bench_attention.md" ] && sed -n -e '/best deterministic `cute`/,/^$/p' \
        -e '/## Forward/,$p' "$LOG/bench_attention.md"
    ;;
determinism)
    fa4_unpack
    step determinism 300 $PY benchmarks/determinism_report.py --out "$LOG" --backends cute \
        --no-grid --long-trials 1000 --tag determinism_cute
    grep -E "repeatable" "$LOG/determinism.log" | tail -n 14
    ;;
determinism-varlen)
    fa4_unpack
    step determinism 540 $PY benchmarks/determinism_report.py --out "$LOG" --backends cute \
        --no-grid --long-masks "" --long-packed heavy:16384,uniform:16384,heavy:65536 \
        --long-trials 1000 --tag determinism_varlen
    grep -E "repeatable" "$LOG/determinism.log" | tail -n 18
    ;;
train)
    fa4_unpack
    export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1  # FA4 compiles once for every process
    # the example at both sizes (every run live at once, in turns), then host time per call
    step training 170 $PY examples/reproducible_training.py \
        --attention dash sdpa-cudnn sdpa-flash fa4-det --out "$LOG"
    [ "$MODE" = small ] || step training_large 200 $PY examples/reproducible_training.py \
        --preset large --attention dash sdpa-cudnn sdpa-flash fa4-det --out "$LOG/large"
    step host 100 $PY benchmarks/host_overhead.py --out "$LOG" --calls 50 --rounds 12
    if [ "$MODE" = profile ]; then  # where a small step's time goes; the host primitives
        step training_profile 150 $PY benchmarks/training_profile.py \
            --attention dash sdpa-cudnn sdpa-flash fa4-det --out "$LOG"
        step costs 50 $PY benchmarks/host_costs.py --out "$LOG"
    fi
    for f in "$LOG/reproducible_training.md" "$LOG/large/reproducible_training.md"; do
        [ -f "$f" ] && sed -n '/^| attention/,$p' "$f"
    done
    [ -f "$LOG/host_overhead.md" ] && grep -E '^(## |\| (dash|fa4|sdpa))' \
        "$LOG/host_overhead.md"
    ;;
versus)
    fa4_unpack
    # both columns in one run: the kernels (replays where every row of a ratio captures,
    # else queued calls) and single calls, host included
    # (MODE 64 or 128: that head dim alone, tagged versus_fa4_d64 / _d128, so that the grid
    # can take two calls: each timing is measured three ways per row)
    DIMS="64 128" TAG=versus_fa4
    case "$MODE" in 64|128) DIMS=$MODE TAG=versus_fa4_d$MODE ;; esac
    step versus 560 $PY benchmarks/versus_fa4.py --out "$LOG" --rounds 4 --time-budget 450 \
        --head-dims $DIMS --tag $TAG
    [ -f "$LOG/$TAG.md" ] && cat "$LOG/$TAG.md"
    ;;
headdims)
    fa4_unpack
    # the test files that run d = 96, its cases only, side by side
    export PYTEST_ADDOPTS="-k 96"
    side_by_side 240 tests/gpu/test_cuda_correctness.py tests/gpu/test_cuda_fast_l2.py \
        tests/gpu/test_cuda_audit.py tests/gpu/test_cuda_determinism.py \
        tests/gpu/test_cuda_cute_window.py tests/gpu/test_cuda_cute_varlen.py
    unset PYTEST_ADDOPTS
    # the packed eager path (EagerAttentionVarlen returns O alone), both backends
    side_by_side 300 tests/gpu/test_cuda_varlen.py  # 146 cases: over 150 s beside the rest
    step determinism 240 $PY benchmarks/determinism_report.py --out "$LOG" --no-grid \
        --backends cute --long-head-dims 96 --long-trials 1000 --tag determinism_d96
    grep -E "repeatable|ERROR" "$LOG/determinism.log" | tail -n 12
    ;;
headdims-schedules)
    fa4_unpack
    # auto takes d = 128's entries at these head dims until their own are measured; then:
    #   python benchmarks/make_auto_table.py benchmarks/results/bench_attention.json \
    #       --head-dims-report benchmarks/results/bench_headdims_schedules.json
    step bench 420 $PY benchmarks/bench_features.py --out "$LOG" --kinds headdims-grid \
        --schedules spt descending shift symmetric_shift interleaved \
        --tag bench_headdims_schedules --rounds 4 --time-budget 330
    [ -f "$LOG/bench_headdims_schedules.md" ] && grep -E '^\| d' "$LOG/bench_headdims_schedules.md"
    ;;
ab-roles)
    fa4_unpack  # (CuTe DSL)
    # exported on the CPU with the same --change and --cells:
    #   python benchmarks/ab_backward_config.py --change roles=math_per_role=true \
    #       --export .ab_roles
    #   python benchmarks/ab_backward_config.py --change roles=math_per_role=true \
    #       --cells 96:causal:4096 96:full:4096 --softcap 50 --export .ab_roles_cap
    step ab 300 $PY benchmarks/ab_backward_config.py --change roles=math_per_role=true \
        --alt .ab_roles --out "$LOG/plain" --rounds 5
    step ab-softcap 300 $PY benchmarks/ab_backward_config.py --change \
        roles=math_per_role=true --alt .ab_roles_cap --cells 96:causal:4096 96:full:4096 \
        --softcap 50 --out "$LOG/softcap" --rounds 5
    cat "$LOG"/plain/*.md "$LOG"/softcap/*.md 2>/dev/null
    ;;
headdims-versus)
    fa4_unpack
    BUDGET=${VERSUS_BUDGET:-420}  # seconds of timing; cells past it are reported unmeasured
    step versus $((BUDGET + 120)) $PY benchmarks/versus_fa4.py --out "$LOG" --tag versus_fa4_d96 \
        --head-dims 96 --seqlens 1024 4096 16384 --schedules 2 --rounds 3 --time-budget "$BUDGET"
    [ -f "$LOG/versus_fa4_d96.md" ] && cat "$LOG/versus_fa4_d96.md"
    ;;
headdims-wide)
    fa4_unpack
    # the CuTe kernels at 192 (d_v 192, 128) and 256: their GPU tests, the Triton ones of
    # the same head dims, the plans, and the key split's L2 and packed tests (the two shapes
    # share the epilogue), side by side; then the anchors' head-dim cells against FA4 in
    # rounds (every backend that runs a cell) (MODE tests or bench: that half only)
    if [ "$MODE" != bench ]; then
        side_by_side 400 tests/gpu/test_cute_head_dims.py tests/gpu/test_triton_head_dims.py \
            tests/gpu/test_cuda_plans.py tests/gpu/test_cuda_fast_l2.py \
            tests/gpu/test_cuda_cute_varlen.py
    fi
    if [ "$MODE" != tests ]; then
        step bench 300 $PY benchmarks/bench_features.py \
            --out "$LOG" --kinds headdims --tag bench_headdims_cute --time-budget 210
        [ -f "$LOG/bench_headdims_cute.md" ] && grep -E '^\| d' "$LOG/bench_headdims_cute.md"
    fi
    ;;
headdims-triton)
    fa4_unpack
    side_by_side 300 tests/gpu/test_triton_head_dims.py tests/gpu/test_cute_sinks.py \
        tests/gpu/test_cuda_plans.py
    # MODE grid: the head dims at S = 1k, 4k and 16k instead of the anchors' shapes
    KIND=headdims TAG=bench_headdims
    [ "$MODE" = grid ] && KIND=headdims-grid TAG=bench_headdims_grid
    step bench 300 $PY benchmarks/bench_features.py --out "$LOG" --kinds $KIND \
        --tag $TAG --time-budget 210
    [ -f "$LOG/$TAG.md" ] && grep -E '^\| d' "$LOG/$TAG.md"
    ;;
sinks)
    fa4_unpack
    side_by_side 300 tests/gpu/test_cute_sinks.py tests/gpu/test_triton_softcap_sinks.py \
        tests/gpu/test_cuda_plans.py
    step bench 240 $PY benchmarks/bench_features.py --out "$LOG" --kinds sinks --tag bench_sinks \
        --time-budget 150
    [ -f "$LOG/bench_sinks.md" ] && grep -E '^\| sinks' "$LOG/bench_sinks.md"
    ;;
pending)
    # MODE tests (default): the GPU tests written or changed since their last GPU run, side
    # by side; MODE bench: the softcap cell and the head-dim grid against FA4 in rounds
    fa4_unpack
    if [ "$MODE" = bench ]; then
        step bench_softcap 200 $PY benchmarks/bench_features.py --out "$LOG" \
            --kinds softcap --tag bench_softcap --time-budget 150
        step bench_headdims_grid 300 $PY benchmarks/bench_features.py --out "$LOG" \
            --kinds headdims-grid --tag bench_headdims_grid --time-budget 210
        for t in bench_softcap bench_headdims_grid; do
            [ -f "$LOG/$t.md" ] && grep -E '^\| (softcap|d)' "$LOG/$t.md"
        done
    else  # MODE quick: all but test_cuda_fast_l2 (the longest)
        fast_l2=tests/gpu/test_cuda_fast_l2.py
        [ "$MODE" = quick ] && fast_l2=
        side_by_side 450 tests/gpu/test_cute_softcap.py tests/gpu/test_triton_softcap_sinks.py \
            tests/gpu/test_cute_sinks.py $fast_l2 \
            tests/gpu/test_cuda_exact.py tests/gpu/test_triton_head_dims.py \
            tests/gpu/test_cuda_plans.py
    fi
    ;;
softcap)
    fa4_unpack
    side_by_side 400 tests/gpu/test_cute_softcap.py tests/gpu/test_triton_softcap_sinks.py
    step bench 240 $PY benchmarks/bench_features.py --out "$LOG" --kinds softcap \
        --tag bench_softcap --time-budget 150
    [ -f "$LOG/bench_softcap.md" ] && grep -E '^\| softcap' "$LOG/bench_softcap.md"
    ;;
hostpath)
    fa4_unpack
    # the host path's tests first (plans, CUDA graphs, compile; the default arithmetic's
    # L2, which runs through the plans), side by side; then the timings, alone
    # (quick: the plan, graph, compile and sink tests alone)
    if [ "$MODE" = quick ]; then
        side_by_side 150 tests/gpu/test_cuda_plans.py tests/gpu/test_cuda_graphs.py \
            tests/gpu/test_compile.py tests/gpu/test_cute_sinks.py
    else
        side_by_side 200 tests/gpu/test_cuda_plans.py tests/gpu/test_cuda_graphs.py \
            tests/gpu/test_compile.py tests/gpu/test_cuda_fast_l2.py \
            tests/gpu/test_cuda_determinism.py tests/gpu/test_cuda_flash_packed.py \
            tests/gpu/test_cuda_correctness.py tests/gpu/test_cute_sinks.py
    fi
    step host 150 $PY benchmarks/host_overhead.py --out "$LOG" --calls 50 --rounds 12
    step costs 60 $PY benchmarks/host_costs.py --out "$LOG"
    [ -f "$LOG/host_overhead.md" ] && grep -E '^(## |\| (dash|fa4|sdpa)|\| `)' \
        "$LOG/host_overhead.md"
    tail -n 30 "$LOG/costs.log"
    ;;
profile)
    fa4_unpack
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
    export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
    step ncu 480 "$NCU" --profile-from-start off --clock-control none --set full \
        --import-source no -f -o "$LOG/report" \
        $PY benchmarks/ncu_workload.py --out "$LOG" ${NCU_CASES:+--cases $NCU_CASES} \
        ${NCU_IMPLS:+--impls $NCU_IMPLS}
    "$NCU" --import "$LOG/report.ncu-rep" --page raw --csv > "$LOG/raw.csv" 2> "$LOG/raw.err"
    "$NCU" --import "$LOG/report.ncu-rep" --page details --csv > "$LOG/details.csv" \
        2> "$LOG/details.err"
    "$NCU" --import "$LOG/report.ncu-rep" --page source --csv --print-source sass \
        > "$LOG/source.csv" 2> "$LOG/source.err"
    ls -la "$LOG"
    tail -n 5 "$LOG/ncu.log"
    for tool in ncu_summary ncu_hotspots; do
        $PY benchmarks/$tool.py "$LOG" --revision "$DASH_GIT_REV" --command \
            "NCU_CASES='${NCU_CASES:-}' NCU_IMPLS='${NCU_IMPLS:-}' scripts/gpu_release.sh profile OUT"
    done
    ;;
suite)
    step tests 560 $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout=120 \
        tests/gpu tests/test_cuda_inputs.py tests/test_exact_asm.py
    grep -E "^(FAILED|ERROR)" "$LOG/tests.log" | head -n 20
    tail -n 2 "$LOG/tests.log"
    ;;
check)
    fa4_unpack
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
        tar czf "$OUT/$STAGE.tgz" -C "$OUT" "$STAGE"
        exit 1
    fi
    step tests 360 $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout=120 \
        tests/gpu tests/test_cuda_inputs.py
    BENCH_ARGS=(--backends triton)  # and cute where CuTe DSL is importable
    $PY -c 'import cutlass' > /dev/null 2>&1 && BENCH_ARGS=(--backends cute triton)
    [ "$MODE" = quick ] && BENCH_ARGS+=(--seqlens 1024 8192)
    step bench 400 $PY benchmarks/bench_attention.py --out "$LOG" --processes "$NPROC" \
        --time-budget 350 "${BENCH_ARGS[@]}"
    echo
    echo "===================== summary ====================="
    grep -E "registers|PTX|SASS" "$LOG/inspect_asm.log" | cut -c1-400
    tail -n 3 "$LOG/tests.log"
    grep -E "^(FAILED|ERROR)" "$LOG/tests.log" | head -n 20
    [ -f "$LOG/bench_attention.md" ] && sed -n '/## The gap/,/## Forward/p' \
        "$LOG/bench_attention.md"
    tar czf "$OUT/$STAGE.tgz" -C "$OUT" "$STAGE"
    exit $status
    ;;
*)
    echo "unknown stage $STAGE" >&2
    exit 2
    ;;
esac
tar czf "$OUT/$STAGE.tgz" -C "$OUT" "$STAGE"
