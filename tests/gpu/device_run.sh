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
    grep -E "^ok .*attention|^ok .*classifier" "$OUT/kernels.log" | head -20
    summary="$summary kernels=$rc"
    timeout 300 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1
    rc=$?
    cat "$OUT/train.log" | tail -25
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
if [ "$what" != tests ]; then
    tests/bench/gpu_bench.sh 124m 16 1024 2>&1 | tee "$OUT/bench.log" | tail -30
fi
echo "SUMMARY:$summary"
