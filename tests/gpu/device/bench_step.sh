#!/bin/bash
# Device call (1 GPU): GEMM algorithm choice by measurement (k_linear.cu,
# LOOM_BLAS_TUNE / LOOM_BLAS_ALGO_CACHE). The kernel test (its tuned-linear
# checks), the whole kernel test again with every backend GEMM tuned, then
# GPT-2 124M loom-gpu-bench: heuristic #0, tuned, tuned writing a table, and
# that table replayed (no timing; its loss lines must equal the writer's).
# Summary on stdout, logs under $OUT.
. "$(dirname "$0")/call_env.sh"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
k() { # NAME ENV...: the kernel test with ENV
    local n=$1
    shift
    env "$@" timeout 300 "$BIN/test_gpu_kernels" >"$OUT/kernels_$n.log" 2>&1
    echo "kernels $n rc=$? $(grep -c '^FAIL' "$OUT/kernels_$n.log") FAIL, $(grep 'checks passed' "$OUT/kernels_$n.log")"
    grep -E '^FAIL' "$OUT/kernels_$n.log" | head -20
}
k default
grep -E '^(ok|FAIL) +(tuned every|table read: every)' "$OUT/kernels_default.log"
el
k tuned LOOM_BLAS_TUNE=1
el
B="$BIN/loom-gpu-bench --model 124m --mbs 16 --T 1024 --steps 30 --warmup 8 --profile 3"
b() { # NAME ENV...: one bench run; RESULT's speed, matmul time and loss
    local n=$1
    shift
    env "$@" timeout 240 $B >"$OUT/bench_$n.out" 2>"$OUT/bench_$n.err"
    echo "bench $n rc=$? $(grep -o '"step_ms_median":[0-9.]*\|"tokens_per_s":[0-9]*\|"matmul":[0-9.]*\|"loss":[0-9.]*' "$OUT/bench_$n.out" | tr '\n' ' ')"
}
T=$OUT/blas_table.txt
rm -f "$T" "$T.lock"
b default
b tuned LOOM_BLAS_TUNE=1
grep -o 'blas: .*' "$OUT/bench_tuned.err"
b table_write LOOM_BLAS_TUNE=1 LOOM_BLAS_ALGO_CACHE="$T"
b table_read LOOM_BLAS_ALGO_CACHE="$T"
grep -o 'blas: .*' "$OUT/bench_table_read.err" | grep -v '^blas: [0-9]* algorithm' | head -5
if grep -q '^step' "$OUT/bench_table_read.err" &&
    diff <(grep '^step' "$OUT/bench_table_write.err") <(grep '^step' "$OUT/bench_table_read.err") >/dev/null; then
    echo "table replay: loss lines equal the writer's"
else
    echo "table replay: LOSS LINES DIFFER (or missing)"
fi
grep -h '^step' "$OUT/bench_default.err" "$OUT/bench_tuned.err" | tail -4
b default_again
el
