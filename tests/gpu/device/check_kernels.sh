#!/bin/bash
# The kernel test (test_gpu_kernels: every backend op against the cpu
# backend) once per setting, on one GPU.
# Usage: tests/gpu/device/check_kernels.sh [NAME[:VAR=VAL,VAR=VAL]...]
#        (default: "default")
#   NAME labels the run (log $OUT/kernels_NAME.log); the VAR=VAL pairs are
#   set for it, e.g. tuned:LOOM_BLAS_TUNE=1 (every backend GEMM's algorithm
#   chosen by timing), quick:LOOM_TEST_QUICK=1, and with CUDNN=1
#   nocudnn:NOCUDNN=1,LOOM_TEST_QUICK=1 (the carried libcudnn off the loader
#   path: the k_attn.cu fallback, "NOT RUN" for the cuDNN cases).
# Per run: rc, FAIL count, the "checks passed" line, NOT RUN and cuDNN line
# counts, the first FAIL lines; after the first run, the tuned-linear checks.
. "$(dirname "$0")/env.sh"
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(default)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | head -1
s=""
first=1
for spec in "${runs[@]}"; do
    n=${spec%%:*}
    vars=""
    [ "$n" != "$spec" ] && vars=${spec#*:}
    log=$OUT/kernels_$n.log
    with_vars "$vars" timeout 300 "$BIN/test_gpu_kernels" >"$log" 2>&1
    r=$?
    echo "kernels $n${vars:+ ($vars)} rc=$r $(grep -c '^FAIL' "$log") FAIL, $(grep 'checks passed' "$log")," \
        "$(grep -c 'NOT RUN' "$log") NOT RUN, $(grep -ci 'cudnn' "$log") cuDNN lines"
    grep -E '^FAIL' "$log" | head -20
    if [ $first = 1 ]; then
        grep -E '^(ok|FAIL) +(tuned every|table read: every)' "$log"
        first=0
    fi
    s="$s $n=$r"
    el
done
echo "SUMMARY:$s"
