#!/bin/bash
# The single-GPU training step: A/Bs of kernel choices through loom-gpu-bench
# (the engine's model and train_step on the CUDA backend, GPT-2 124M,
# micro-batch 16, T 1024, median step after 8 warm-up steps) and the kernel
# micro-benchmarks, on one GPU.
# Usage: tests/gpu/device/bench_step.sh MODE...   (default: blas)
#   blas      GEMM algorithm choice by measurement (k_linear.cu,
#             LOOM_BLAS_TUNE / LOOM_BLAS_ALGO_CACHE): heuristic #0, tuned,
#             tuned writing a table, that table replayed (its loss lines must
#             equal the writer's), heuristic again
#   fusions   DGELU fusion off / on (LOOM_FUSE_DGELU), GEMM tuning on top, the
#             first two again, a profile (the norm variants that lost their
#             measurement live in dev/cuda: bench_norm times them)
#   micro     bench_adamw, bench_attn 20, bench_norm 30 (every variant in one
#             process, with agreement and bit-repeat checks)
#   attn      bench_attn: every attention variant of dev/cuda beside the
#             shipped kernel, in one process
#   ncu       Nsight Compute on the attention, cross-entropy, norm, GELU and
#             AdamW kernels (when ncu is found)
# Summary on stdout, logs under $OUT.
. "$(dirname "$0")/env.sh"
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(blas)
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | head -1
B=("$BIN/loom-gpu-bench" --model 124m --mbs 16 --T 1024 --steps 30 --warmup 8)
bench() { # NAME VAR=VAL...: one loom-gpu-bench run; its speed, matmul time and loss
    local n=$1
    shift
    env "$@" timeout 240 "${B[@]}" ${EXTRA:-} >"$OUT/bench_$n.out" 2>"$OUT/bench_$n.err"
    echo "bench $n rc=$? $(grep -o '"step_ms_median":[0-9.]*\|"tokens_per_s":[0-9]*\|"matmul":[0-9.]*\|"loss":[0-9.]*' \
        "$OUT/bench_$n.out" | tr '\n' ' ')"
}
for m in "${modes[@]}"; do
    case $m in
    blas)
        T=$OUT/blas_table.txt
        rm -f "$T" "$T.lock"
        EXTRA="--profile 3" bench default
        EXTRA="--profile 3" bench tuned LOOM_BLAS_TUNE=1
        grep -o 'blas: .*' "$OUT/bench_tuned.err"
        EXTRA="--profile 3" bench table_write LOOM_BLAS_TUNE=1 LOOM_BLAS_ALGO_CACHE="$T"
        EXTRA="--profile 3" bench table_read LOOM_BLAS_ALGO_CACHE="$T"
        grep -o 'blas: .*' "$OUT/bench_table_read.err" | grep -v '^blas: [0-9]* algorithm' | head -5
        if grep -q '^step' "$OUT/bench_table_read.err" &&
            diff <(grep '^step' "$OUT/bench_table_write.err") <(grep '^step' "$OUT/bench_table_read.err") >/dev/null; then
            echo "table replay: loss lines equal the writer's"
        else
            echo "table replay: LOSS LINES DIFFER (or missing)"
        fi
        grep -h '^step' "$OUT/bench_default.err" "$OUT/bench_tuned.err" | tail -4
        EXTRA="--profile 3" bench default_again
        ;;
    fusions)
        bench base LOOM_FUSE_DGELU=0
        bench dgelu
        bench tuned LOOM_BLAS_TUNE=1
        grep -o 'blas: .*' "$OUT/bench_tuned.err" | head -30
        bench base2 LOOM_FUSE_DGELU=0
        bench dgelu2
        EXTRA="--profile 3" bench prof
        grep -o '"breakdown_ms":{[^}]*}' "$OUT/bench_prof.out"
        ;;
    micro)
        for b in "bench_adamw" "bench_attn 20" "bench_norm 30"; do
            read -ra cmd <<<"$b"
            if [ -x "$BIN/${cmd[0]}" ]; then
                timeout 120 "$BIN/${cmd[0]}" "${cmd[@]:1}" >"$OUT/${cmd[0]}.log" 2>&1
                echo "${cmd[0]} rc=$?"
                cut -c1-400 "$OUT/${cmd[0]}.log" | tail -25
            else
                echo "${cmd[0]}: not carried"
            fi
        done
        ;;
    attn)
        # the worker runs the chosen kernels; bench_attn times every variant
        # kept in dev/cuda in one process
        timeout 120 "$BIN/bench_attn" >"$OUT/bench_attn.out" 2>&1
        echo "bench_attn rc=$?"
        grep -E '^RESULT|^ok|^FAIL' "$OUT/bench_attn.out" | head -20
        ;;
    ncu)
        nc=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        if [ -z "$nc" ]; then
            echo "ncu: not found"
            continue
        fi
        timeout 180 "$nc" --clock-control none -k regex:'attn|xent|norm|gelu|adamw' \
            --launch-skip 40 --launch-count 12 --section SpeedOfLight --section Occupancy \
            --section WarpStateStats --section LaunchStats \
            "$BIN/loom-gpu-bench" --steps 1 --warmup 1 --profile 0 >"$OUT/ncu.txt" 2>&1
        grep -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per" \
            "$OUT/ncu.txt" | head -60
        ;;
    *)
        echo "bench_step.sh: unknown mode '$m'" >&2
        exit 2
        ;;
    esac
    el
done
