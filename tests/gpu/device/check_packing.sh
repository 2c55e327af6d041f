#!/bin/bash
# train.packing "document" on one GPU: the document-attention kernel checks of
# test_gpu_kernels (the "doc" lines: k_attn.cu's document mask forward and
# backward against a host reference, tiles skipped or masked, RoPE and learned
# positions within documents), then a packed window through the real
# loom-worker on cuda against float64 torch run per document
# (tests/datasets/test_packing.py cuda), and the document kernels' speed against the
# causal ones (tests/gpu/bench_attn_doc.c: one RESULT line per shape, document length, skip).
# Usage: tests/gpu/device/check_packing.sh   (BUILD: the carried build folder)
# PASS/FAIL lines, then "SUMMARY: part=rc ..." on stdout; logs under $OUT.
. "$(dirname "$0")/env.sh"
LOOM_TEST_DOC_ONLY=1 timeout 300 "$BIN/test_gpu_kernels" >"$OUT/kernels_doc.log" 2>&1
r=$?
grep -E "^(PASS|FAIL)|checks passed" "$OUT/kernels_doc.log"
s="kernels=$r"
timeout 300 python3 tests/datasets/test_packing.py "$BIN/loom-worker" cuda \
    >"$OUT/packing_cuda.log" 2>&1
r=$?
grep -E "^(ok|FAIL|PASS)" "$OUT/packing_cuda.log"
s="$s packing_cuda=$r"
timeout 200 "$BIN/bench_attn_doc" 20 >"$OUT/bench_attn_doc.out" 2>&1
r=$?
grep '^RESULT' "$OUT/bench_attn_doc.out" || tail -5 "$OUT/bench_attn_doc.out"
s="$s bench_attn_doc=$r"
echo "SUMMARY: $s $(el)"
