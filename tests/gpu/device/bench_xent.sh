#!/bin/bash
# The classifier on the Llama 3.2 1B shape (T 2048, micro-batch 4;
# vocabulary 128256): loom-gpu-bench, each with the per-class profile, for
# each value MIB of the xent-chunk-mib row: 0 is the default (chunks of up to
# 2 GiB: all 8192 rows, the full 2.1 GB of logits), 512 and 1024 smaller
# chunks. One RESULT line per setting, tagged with its value.
# Usage: tests/gpu/device/bench_xent.sh   (BUILD: the carried build folder;
# LLAMA: the model preset, default 1b; XENT_SETS: the values). Logs under $OUT.
. "$(dirname "$0")/env.sh"
for mib in ${XENT_SETS:-0 512 1024}; do
    log=$OUT/xent_$mib
    LOOM_XENT_CHUNK_MIB=$mib timeout 150 "$BIN/loom-gpu-bench" --family llama \
        --model "${LLAMA:-1b}" --mbs 4 --T 2048 --profile 3 >"$log.out" 2>"$log.err"
    r=$?
    echo "xent-chunk-mib $mib rc=$r $(el)"
    grep -A12 '^GPU time per step' "$log.err"
    sed -n "s/^RESULT {/RESULT {\"xent_chunk_mib\":$mib,/p" "$log.out"
    [ $r = 0 ] || tail -5 "$log.err"
done
