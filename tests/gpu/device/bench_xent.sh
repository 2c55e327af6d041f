#!/bin/bash
# The classifier on the Llama 3.2 1B shape (T 2048, micro-batch 4;
# vocabulary 128256): loom-gpu-bench, each with the per-class profile, under
# settings MIB:L2 of the xent-chunk-mib and xent-l2 rows: 0:0 is the previous
# path and the default (chunks of up to 2 GiB: all 8192 rows, the full 2.1 GB
# of logits; one block per row), 512:0 and 1024:0 smaller chunks, 512:1 and
# 0:1 the persistent-grid loss kernel. One RESULT line per setting, tagged with both values.
# Usage: tests/gpu/device/bench_xent.sh   (BUILD: the carried build folder;
# LLAMA: the model preset, default 1b; XENT_SETS: the settings). Logs under $OUT.
. "$(dirname "$0")/env.sh"
for set in ${XENT_SETS:-0:0 512:0 1024:0 512:1 0:1}; do
    mib=${set%:*} l2=${set#*:}
    log=$OUT/xent_${mib}_$l2
    LOOM_XENT_CHUNK_MIB=$mib LOOM_XENT_L2=$l2 timeout 150 "$BIN/loom-gpu-bench" --family llama \
        --model "${LLAMA:-1b}" --mbs 4 --T 2048 --profile 3 >"$log.out" 2>"$log.err"
    r=$?
    echo "xent-chunk-mib $mib xent-l2 $l2 rc=$r $(el)"
    grep -A12 '^GPU time per step' "$log.err"
    sed -n "s/^RESULT {/RESULT {\"xent_chunk_mib\":$mib,\"xent_l2\":$l2,/p" "$log.out"
    [ $r = 0 ] || tail -5 "$log.err"
done
