#!/bin/bash
# LoRA throughput and memory beside the PyTorch peer, in one call, one GPU:
# rank-16 adapters (alpha 32) on every projection of the Llama 3.2 1B and
# Llama 3 8B shapes at micro-batch 4, T 2048 (loom-gpu-bench --lora 16 against
# llama_torch_bench.py --lora 16, compiled), the 8B shape also with selective
# and full recompute, the budget mode at 41.7 GiB (--keep 28), fp8 (the base
# held as E4M3 alone) with and without selective recompute, and QLoRA
# (--quantize-base nf4) on the Llama 2 70B shape at micro-batch 1, T 2048.
# Goals (docs/perf.md "LoRA"): tokens/s >= 1.3x the peer's, memory <= 0.8x
# (8B); the 70B QLoRA run fits.
# Usage: [RUNS="8b_fp8 1b ..."] tests/gpu/device/bench_lora.sh   (BUILD: the
# carried build folder; the peers in .deps/peers). One RESULT line per run and a "ratio" line per
# pair on stdout, logs under $OUT.
. "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
loom() { # TAG TIMEOUT ARGS...: one loom-gpu-bench run, its RESULT line
    local tag=$1 to=$2
    shift 2
    timeout "$to" "$BIN/loom-gpu-bench" --family llama "$@" >"$OUT/lora_$tag.out" \
        2>"$OUT/lora_$tag.err"
    echo "loom $tag rc=$? $(el)"
    grep -h '^RESULT' "$OUT/lora_$tag.out" | sed "s/^RESULT {/RESULT {\"tag\":\"$tag\",/" ||
        tail -5 "$OUT/lora_$tag.err"
    grep -h -A9 "GPU time per step" "$OUT/lora_$tag.err" | head -10
}
peer() { # MODEL: the compiled PyTorch peer with --lora 16
    PYTHONUNBUFFERED=1 timeout 240 python3 .deps/peers/llama_torch_bench.py --model "$1" \
        --mbs 4 --T 2048 --lora 16 --steps 12 --warmup 4 >"$OUT/lora_peer_$1.out" \
        2>"$OUT/lora_peer_$1.err"
    echo "peer $1 rc=$? $(el)"
    grep -h '^RESULT' "$OUT/lora_peer_$1.out" | sed "s/^RESULT {/RESULT {\"tag\":\"peer_$1\",/" ||
        tail -5 "$OUT/lora_peer_$1.err"
}
ratio() { # LOOM_TAG PEER_MODEL: loom / peer tokens/s and memory
    python3 - "$OUT/lora_$1.out" "$OUT/lora_peer_$2.out" "$1" <<'EOF'
import json, sys
def res(p):
    try:
        return json.loads([l for l in open(p) if l.startswith("RESULT")][-1][7:])
    except Exception:
        return None
a, b = res(sys.argv[1]), res(sys.argv[2])
if not a or not b:
    print("ratio %s: missing a RESULT line" % sys.argv[3])
else:
    t, m = a["tokens_per_s"] / b["tokens_per_s"], a["mem_gib"] / b["max_mem_gib"]
    print("ratio %s: tokens/s %.3fx the peer (goal >= 1.3) %s, memory %.3fx (goal <= 0.8) %s"
          % (sys.argv[3], t, "PASS" if t >= 1.3 else "FAIL", m, "PASS" if m <= 0.8 else "FAIL"))
EOF
}
# The runs (tag: loom-gpu-bench arguments after --family llama); RUNS picks
# some, in its order (default: all of them in this order). Loom's runs first
# (the device call may be cut short), then the peers each model needs (12 timed
# steps after 4 warm-up ones) and the ratios.
declare -A ARGS=(
    [8b]="--model 8b --mbs 4 --T 2048 --lora 16 --steps 8 --warmup 2 --profile 1"
    [8b_selective]="--model 8b --mbs 4 --T 2048 --lora 16 --recompute selective --steps 5 --warmup 2 --profile 0"
    # the budget mode at the memory goal ({"budget_gib": 41.7}: the planner keeps 28 of 32 blocks)
    [8b_budget]="--model 8b --mbs 4 --T 2048 --lora 16 --recompute full --keep 28 --steps 5 --warmup 2 --profile 0"
    # fp8: the base held as E4M3 alone on the GPU (LOOM_FP8_BASE_BF16=1: bf16 + copies)
    [8b_fp8]="--model 8b --mbs 4 --T 2048 --lora 16 --precision fp8 --steps 8 --warmup 2 --profile 1"
    [8b_fp8_selective]="--model 8b --mbs 4 --T 2048 --lora 16 --precision fp8 --recompute selective --steps 5 --warmup 2 --profile 0"
    # QLoRA on the Llama 2 70B shape (goal: fits on one GPU at micro-batch 1, T 2048)
    [70b_nf4]="--model 70b --mbs 1 --T 2048 --lora 16 --quantize-base nf4 --recompute selective --steps 2 --warmup 1 --profile 0"
    [1b]="--model 1b --mbs 4 --T 2048 --lora 16 --steps 20 --warmup 5 --profile 1"
    [1b_fp8]="--model 1b --mbs 4 --T 2048 --lora 16 --precision fp8 --steps 20 --warmup 5 --profile 1"
    [8b_full]="--model 8b --mbs 4 --T 2048 --lora 16 --recompute full --steps 5 --warmup 2 --profile 0"
)
ORDER=(8b 8b_selective 8b_budget 8b_fp8 8b_fp8_selective 70b_nf4 1b 1b_fp8 8b_full)
read -ra runs <<<"${RUNS:-${ORDER[*]}}"
for tag in "${runs[@]}"; do
    [ -n "${ARGS[$tag]:-}" ] || { echo "unknown run $tag"; continue; }
    to=150
    case $tag in 8b | 8b_fp8) to=200 ;; 70b_nf4) to=300 ;; esac
    # shellcheck disable=SC2086
    loom "$tag" "$to" ${ARGS[$tag]}
    [ "$tag" = 70b_nf4 ] && grep -h '^nf4:' "$OUT/lora_70b_nf4.err"
done
for model in 8b 1b; do
    want=0
    for tag in "${runs[@]}"; do [ "${tag%%_*}" = "$model" ] && want=1; done
    [ $want = 1 ] || continue
    peer "$model"
    for tag in "${runs[@]}"; do [ "${tag%%_*}" = "$model" ] && ratio "$tag" "$model"; done
done
