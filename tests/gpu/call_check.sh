#!/bin/bash
# Device call: correctness of the committed tree on 2 GPUs in one go
# (kernels, 1-GPU training, memcheck, every 2-GPU layout's curve, the
# control-plane job). Summary on stdout, logs under $OUT.
set -u
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/loom-gpu} BUILD=${BUILD:-build-cuda}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
BIN=$BUILD/bin
t0=$(date +%s)
if ldd "$BIN/loom-worker" | grep -q "libnccl.so.2 => not found"; then
    nl=$(find /usr/local /opt /usr/lib -name 'libnccl.so.2*' 2>/dev/null | head -1)
    [ -n "$nl" ] && export LD_LIBRARY_PATH=$(dirname "$nl"):$LD_LIBRARY_PATH
fi
for b in loomd loom-agent loom-worker test_gpu_kernels; do ldd "$BIN/$b" | grep "not found"; done
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
s=""
timeout 200 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1; r=$?
grep -E "^FAIL|checks passed" "$OUT/kernels.log" | head; s="$s kernels=$r"
echo "t=$(( $(date +%s) - t0 ))"
timeout 200 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1; r=$?
grep -E "^FAIL|passed|FAILED" "$OUT/train.log" | head; s="$s train=$r"
echo "t=$(( $(date +%s) - t0 ))"
mkdir -p "$OUT/dist"
timeout 240 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" \
    "dp=2,zero_stage=0;dp=2,zero_stage=1;dp=2,zero_stage=2;dp=2,zero_stage=3;pp=2;tp=2"; s="$s curves=$?"
echo "t=$(( $(date +%s) - t0 ))"
timeout 200 python3 tests/gpu/cluster_gpu.py "$BIN" >"$OUT/cluster.log" 2>&1; r=$?
tail -12 "$OUT/cluster.log"; s="$s cluster=$r"
echo "t=$(( $(date +%s) - t0 ))"
cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$cs" ]; then
    LOOM_TEST_QUICK=1 timeout 120 "$cs" --tool memcheck --error-exitcode 9 "$BIN/test_gpu_kernels" \
        >"$OUT/memcheck.log" 2>&1; r=$?
    grep -E "ERROR SUMMARY|checks passed" "$OUT/memcheck.log" | tail -2; s="$s memcheck=$r"
fi
echo "t=$(( $(date +%s) - t0 ))"
echo "SUMMARY:$s"
