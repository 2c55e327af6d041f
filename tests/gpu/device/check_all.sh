#!/bin/bash
# Device call: correctness of the committed tree on 2 GPUs in one go
# (kernels, 1-GPU training, memcheck, every 2-GPU layout's curve, the
# control-plane job). Summary on stdout, logs under $OUT.
. "$(dirname "$0")/call_env.sh"
for b in loomd loom-agent loom-worker test_gpu_kernels; do ldd "$BIN/$b" | grep "not found"; done
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
s=""
timeout 200 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1; r=$?
grep -E "^FAIL|checks passed" "$OUT/kernels.log" | head; s="$s kernels=$r"
el
timeout 200 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1; r=$?
grep -E "^FAIL|passed|FAILED" "$OUT/train.log" | head; s="$s train=$r"
el
mkdir -p "$OUT/dist"
timeout 240 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" \
    "dp=2,zero_stage=0;dp=2,zero_stage=1;dp=2,zero_stage=2;dp=2,zero_stage=3;pp=2;pp=2,pp_balance=1;tp=2"; s="$s curves=$?"
el
timeout 200 python3 tests/gpu/cluster_gpu.py "$BIN" >"$OUT/cluster.log" 2>&1; r=$?
tail -12 "$OUT/cluster.log"; s="$s cluster=$r"
el
cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$cs" ]; then
    LOOM_TEST_QUICK=1 timeout 120 "$cs" --tool memcheck --error-exitcode 9 "$BIN/test_gpu_kernels" \
        >"$OUT/memcheck.log" 2>&1; r=$?
    grep -E "ERROR SUMMARY|checks passed" "$OUT/memcheck.log" | tail -2; s="$s memcheck=$r"
fi
el
echo "SUMMARY:$s"
