#!/bin/bash
# One call on the GPU machine (built here, carried there): the gpu-labelled
# tests, compute-sanitizer memcheck and racecheck on the kernel test, then
# the benchmark against PyTorch. Full logs go to $OUT (or /tmp/loom-gpu);
# stdout ends with a short summary.
# Usage (repo root): tests/gpu/device_run.sh [tests|bench|all]
set -u
cd "$(dirname "$0")/../.."
what=${1:-all}
OUT=${OUT:-/tmp/loom-gpu}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
BIN=${BUILD:-build-cuda}/bin
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv \
    | tee "$OUT/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/gpu.txt"
for b in test_gpu_kernels test_gpu_train loom-gpu-bench; do
    ldd "$BIN/$b" | grep "not found" && echo "MISSING LIBS for $b"
done
summary=""
if [ "$what" != bench ]; then
    timeout 240 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1
    rc=$?
    grep -E "^FAIL|checks passed|seed" "$OUT/kernels.log"
    summary="$summary kernels=$rc"
    timeout 300 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1
    rc=$?
    grep -E "^(ok|FAIL)|passed|FAILED" "$OUT/train.log"
    summary="$summary train=$rc"
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [ -n "$cs" ]; then
        for tool in memcheck racecheck; do
            LOOM_TEST_QUICK=1 timeout 240 "$cs" --tool "$tool" --error-exitcode 9 \
                "$BIN/test_gpu_kernels" >"$OUT/$tool.log" 2>&1
            rc=$?
            grep -E "ERROR SUMMARY|RACECHECK SUMMARY|checks passed" "$OUT/$tool.log" | tail -3
            summary="$summary $tool=$rc"
        done
    else
        summary="$summary sanitizer=not-found"
    fi
fi
if [ "$what" = all ] || [ "$what" = tune ]; then
    # attention kernel variants (speed knobs only): GPU ms per step by class
    for v in "0 1" "0 0" "1 1"; do
        set -- $v
        LOOM_ATTN_FWD_VARIANT=$1 LOOM_ATTN_BWD_VARIANT=$2 "$BIN/loom-gpu-bench" --steps 12 \
            --warmup 4 --profile 2 >"$OUT/var_$1$2.out" 2>&1
        echo "variant fwd=$1 bwd=$2: $(grep -o '"step_ms_median":[0-9.]*' "$OUT/var_$1$2.out") \
$(grep -o '"attention":[0-9.]*' "$OUT/var_$1$2.out")"
    done
    nc=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    if [ -n "$nc" ] && [ "${NCU:-0}" = 1 ]; then
        timeout 180 "$nc" --clock-control none -k regex:'attn|xent|norm|gelu|adamw' \
            --launch-skip 40 --launch-count 12 --section SpeedOfLight --section Occupancy \
            --section WarpStateStats --section LaunchStats \
            "$BIN/loom-gpu-bench" --steps 1 --warmup 1 --profile 0 >"$OUT/ncu.txt" 2>&1
        grep -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per" \
            "$OUT/ncu.txt" | head -60
    fi
fi
if [ "$what" != tests ] && [ "$what" != tune ]; then
    tests/bench/gpu_bench.sh 124m 16 1024 2>&1 | tee "$OUT/bench.log" | tail -30
    if [ "${BIG:-0}" = 1 ]; then
        timeout 300 tests/bench/gpu_bench.sh 1558m 8 1024 >"$OUT/bench1558.log" 2>&1
        grep -E "GPU time|^  |RESULT|ratio|rc=|^loom |^torch " "$OUT/bench1558.log" | tail -16
    fi
fi
echo "SUMMARY:$summary"
