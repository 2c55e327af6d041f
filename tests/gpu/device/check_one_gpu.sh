#!/bin/bash
# Correctness of the built tree on one GPU, in one go: every binary finds its
# libraries, the kernel and training tests, the planner's memory against the
# engine's allocations, the CUDA host checks, the decode operations (test_gpu_decode),
# Hugging Face scoring and KV-cached generation in bf16 against the torch reference
# (tests/hf/test_hf.py cuda), and the device line
# the worker logs (its compute capability: which cubin of the fat binary runs).
# Usage: tests/gpu/device/check_one_gpu.sh   (BUILD: the carried build folder)
# Summary line "SUMMARY: part=rc ..." on stdout, logs under $OUT.
. "$(dirname "$0")/env.sh"
tests/gpu/device/check_all.sh libs kernels train | tee "$OUT/check_all.txt"
s=$(grep '^SUMMARY' "$OUT/check_all.txt" | sed 's/^SUMMARY://')
for t in test_planner_engine test_cuda_host test_gpu_decode; do
    timeout 200 "$BIN/$t" >"$OUT/$t.log" 2>&1
    r=$?
    tail -2 "$OUT/$t.log"
    s="$s $t=$r"
done
timeout 600 python3 tests/hf/test_hf.py "$BIN/loom-worker" cuda >"$OUT/hf_cuda.log" 2>&1
r=$?
grep -E "cuda:|cuda kv|cuda recompute|determined|FAIL|failures" "$OUT/hf_cuda.log" | head -40
s="$s hf_cuda=$r"
# the device line of a real worker run (a tiny HF-layout Llama scored on cuda)
python3 tests/hf/make_tiny_hf.py "$OUT/tiny" >/dev/null 2>&1
"$BIN/loom-worker" --device cuda --init-from "$OUT/tiny/llama" --score-tokens 1,2,3 \
    >"$OUT/worker_device.out" 2>"$OUT/worker_device.err"
s="$s worker_score=$?"
grep -h "cuda backend: device" "$OUT/worker_device.err" | head -2
rm -rf "$OUT/tiny"
timeout 300 "$BIN/test_lora_cuda" >"$OUT/lora_cuda.log" 2>&1; r=$?; grep -E "^(PASS|FAIL)|memory" "$OUT/lora_cuda.log"; s="$s lora_cuda=$r"
echo "SUMMARY:$s $(el)"
