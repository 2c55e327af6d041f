#!/bin/bash
# LoRA dropout on the Llama 3.2 1B shape (rank-16 adapters on every
# projection, micro-batch 4, T 2048, 20 timed steps after 5 warm-up ones, one
# profiled step): dropout 0 and 0.1, each with the dropout kernels (the mask
# applied inside the adapter's x.A products, the lora-drop-fused row, default)
# and without (LOOM_LORA_DROP_FUSED=0: a masked copy of the input, then
# cuBLASLt). At dropout 0 the row changes nothing (the same path runs).
# Usage: tests/gpu/device/bench_lora_drop.sh   (BUILD: the carried build
# folder). One RESULT line per run (its tag added) on stdout, the profile's
# "GPU time per step" table after it, logs under $OUT.
. "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
run() { # TAG FUSED DROPOUT: one loom-gpu-bench run, its RESULT line
    local tag=$1
    LOOM_LORA_DROP_FUSED=$2 timeout 200 "$BIN/loom-gpu-bench" --family llama --model 1b \
        --mbs 4 --T 2048 --lora 16 --lora-dropout "$3" --steps 20 --warmup 5 --profile 1 \
        >"$OUT/lora_drop_$tag.out" 2>"$OUT/lora_drop_$tag.err"
    echo "loom $tag rc=$? $(el)"
    grep -h '^RESULT' "$OUT/lora_drop_$tag.out" |
        sed "s/^RESULT {/RESULT {\"tag\":\"$tag\",\"lora_dropout\":$3,\"lora_drop_fused\":$2,/" ||
        tail -5 "$OUT/lora_drop_$tag.err"
    grep -h -A9 "GPU time per step" "$OUT/lora_drop_$tag.err" | head -10
}
run 1b_p0 1 0
run 1b_p0_rowoff 0 0
run 1b_p01_fused 1 0.1
run 1b_p01_copy 0 0.1
