#!/bin/bash
# QLoRA start-up and throughput on one GPU: the NF4 storage check (test_nf4_upload: the
# device views equal the host reference after a pipelined upload), the host NF4
# quantizer's speed on this machine's cores (bench_nf4: the serial reference against the
# threaded one, same bytes), then loom-gpu-bench with rank-16 adapters over an NF4 base
# (--quantize-base nf4) on the Llama 2 70B shape (micro-batch 1, T 2048, selective
# recompute: the goal is that it fits and starts well inside the call) and on the Llama 3
# 8B shape (micro-batch 4, T 2048). Prints per run: the "nf4:" line (tensors, GiB, init
# seconds and the share of quantization and upload), one RESULT line (tokens_per_s,
# mem_gib, nf4_init_s, nf4_put_s) and a PASS/FAIL line.
# Not run on a GPU yet (written without one; built with CUDA for sm_90).
# Usage: tests/gpu/device/bench_qlora70.sh (BUILD: the carried build folder, with
# bin/loom-gpu-bench, bin/test_nf4_upload and bin/bench_nf4); logs under $OUT.
. "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
echo "cpus $(nproc)"
# the NF4 storage path on this GPU (pipelined upload, bf16 pieces, serial quantizer)
timeout 200 "$BIN/test_nf4_upload" >"$OUT/nf4_upload.log" 2>&1
echo "test_nf4_upload rc=$? $(el)"
grep -E "^(PASS|FAIL)|no GPU" "$OUT/nf4_upload.log"
if [ -x "$BIN/bench_nf4" ]; then
    timeout 120 "$BIN/bench_nf4" --n 268435456 --reps 2 >"$OUT/nf4_host.out" 2>"$OUT/nf4_host.err"
    echo "bench_nf4 rc=$? $(el)"
    cat "$OUT/nf4_host.err"
    grep -h '^RESULT' "$OUT/nf4_host.out"
    if grep -q '"identical":true' "$OUT/nf4_host.out"; then
        echo "PASS: bench_nf4 fast quantizer bytes equal the serial reference"
    else
        echo "FAIL: bench_nf4 fast quantizer bytes equal the serial reference"
    fi
fi
qlora() { # TAG TIMEOUT ARGS...: one loom-gpu-bench run, its nf4 line and RESULT line
    local tag=$1 to=$2
    shift 2
    timeout "$to" "$BIN/loom-gpu-bench" --family llama "$@" >"$OUT/qlora_$tag.out" \
        2>"$OUT/qlora_$tag.err"
    local rc=$?
    echo "loom $tag rc=$rc $(el)"
    grep -h '^nf4:' "$OUT/qlora_$tag.err"
    if grep -q '^RESULT' "$OUT/qlora_$tag.out"; then
        grep -h '^RESULT' "$OUT/qlora_$tag.out" | sed "s/^RESULT {/RESULT {\"tag\":\"$tag\",/"
        echo "PASS: qlora $tag runs its steps (rc=$rc)"
    else
        tail -5 "$OUT/qlora_$tag.err"
        echo "FAIL: qlora $tag runs its steps (rc=$rc)"
    fi
}
qlora 70b 400 --model 70b --mbs 1 --T 2048 --lora 16 --quantize-base nf4 --recompute selective \
    --steps 3 --warmup 1 --profile 0
qlora 8b 150 --model 8b --mbs 4 --T 2048 --lora 16 --quantize-base nf4 --steps 6 --warmup 2 \
    --profile 0
