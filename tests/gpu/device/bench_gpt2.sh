#!/bin/bash
# GPT-2 training throughput through loom-worker on one GPU and on two (data
# parallel), beside PyTorch compiled on the same machine in the same call.
# Usage: tests/gpu/device/bench_gpt2.sh STEP[:VAR=VAL,VAR=VAL]...
#   (default: 1gpu dp2 ddp dp2 1gpu, the comparison of docs/perf.md)
# Steps, each run with its VAR=VAL pairs set (e.g. dp2:LOOM_DP_PAIR=0 for
# NCCL instead of the copy-engine pair all-reduce, 1gpu:LOOM_ATTN_CUDNN=0,
# dp2:ZERO=1, 1gpu:NOCUDNN=1 (with CUDNN=1: without the carried libcudnn),
# dp2:LOOM_PAIR_TRACE=12 which also prints rank 0's copy trace):
#   1gpu, dp2  loom-worker --nproc 1 / 2 (env.sh worker_bench: MODEL, MBS,
#              ZERO, STEPS; tokens/s, step ms, exposed comm ms)
#   ddp, fsdp  the PyTorch peer on 2 GPUs (env.sh peer_torch)
#   single     tests/bench/gpu_bench.sh MODEL MBS 1024: loom-gpu-bench and
#              loom-worker on one GPU beside PyTorch on one GPU, with the ratio
#   adamw      bench_adamw (the AdamW kernels' bandwidth)
#   logs       which attention path and dp gradient path the workers logged
# Env: MODEL (124m), MBS (16), ZERO (0), STEPS (40), CUDNN=1 (env.sh).
. "$(dirname "$0")/env.sh"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(1gpu dp2 ddp dp2 1gpu)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
echo "model $MODEL, micro-batch $MBS, ZeRO $ZERO, $STEPS steps"
n_ddp=0
for spec in "${steps[@]}"; do
    what=${spec%%:*}
    vars=""
    [ "$what" != "$spec" ] && vars=${spec#*:}
    label="$what${vars:+ ($vars)}"
    case $what in
    1gpu) echo "$label: $(with_vars "$vars" worker_bench 1)" ;;
    dp2)
        echo "$label: $(with_vars "$vars" worker_bench 2)"
        case ",$vars" in
        *,LOOM_PAIR_TRACE=*)
            grep -h "pair trace" "$OUT"/dist/bench_"${MODEL}"_2_z*.err 2>/dev/null | grep "rank 0" | tail -12
            ;;
        esac
        ;;
    ddp | fsdp)
        n_ddp=$((n_ddp + 1))
        echo "$label: $(with_vars "$vars" peer_torch "$what" "$n_ddp" | tr '\n' ' ')"
        ;;
    single)
        BUILD=$BUILD with_vars "$vars" timeout 400 tests/bench/gpu_bench.sh "$MODEL" "$MBS" 1024 \
            >"$OUT/single_$MODEL.log" 2>&1
        echo "$label rc=$?"
        grep -E "GPU time|^  |RESULT|ratio|rc=|^loom |^torch " "$OUT/single_$MODEL.log" | tail -16
        ;;
    adamw)
        if [ -x "$BIN/bench_adamw" ]; then
            with_vars "$vars" timeout 60 "$BIN/bench_adamw" | grep -E "RESULT|differ"
        else
            echo "adamw: $BIN/bench_adamw not carried"
        fi
        ;;
    logs)
        grep -h "attention through\|copy engines\|per-token rows\|summed by" "$OUT"/dist/*.err \
            2>/dev/null | sed 's/.*info [a-z._]*:[0-9]*: //' | sort | uniq -c | head -8
        ;;
    *)
        echo "bench_gpt2.sh: unknown step '$what'" >&2
        exit 2
        ;;
    esac
    el
done
