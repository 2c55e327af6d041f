#!/bin/bash
# Third session, device call (2 GPUs) for the single-GPU step work: kernel
# tests (norm variants, GEMM tuning, matmul_bwd + DGELU fusion), bench_norm,
# GPT-2 124M loom-gpu-bench A/B of each change, then with the best norm
# variant: 1-GPU training test, curves, and 1 GPU / dp2 / PyTorch DDP.
. "$(dirname "$0")/call_env.sh"
k() { local n=$1; shift
    env "$@" timeout 200 "$BIN/test_gpu_kernels" >"$OUT/kernels_$n.log" 2>&1
    echo "kernels $n rc=$? $(grep 'checks passed' "$OUT/kernels_$n.log")"; grep -E '^FAIL' "$OUT/kernels_$n.log" | head -10; }
k default
k tuned LOOM_BLAS_TUNE=1
el
timeout 60 "$BIN/bench_norm" 30 >"$OUT/bench_norm.log" 2>&1; echo "bench_norm rc=$?"; tail -25 "$OUT/bench_norm.log"
el
B="$BIN/loom-gpu-bench --model 124m --mbs 16 --T 1024 --steps 30 --warmup 8"
declare -A MS
g() { local n=$1; shift
    env "$@" timeout 120 $B ${EXTRA:-} >"$OUT/g_$n.out" 2>"$OUT/g_$n.err"
    MS[$n]=$(grep -o '"step_ms_median":[0-9.]*' "$OUT/g_$n.out" | cut -d: -f2)
    echo "gpu-bench $n rc=$? $(grep -o '"step_ms_median":[0-9.]*\|"tokens_per_s":[0-9]*' "$OUT/g_$n.out" | tr '\n' ' ')"; }
g base LOOM_FUSE_DGELU=0 LOOM_NORM_VARIANT=0
g dgelu LOOM_NORM_VARIANT=0
for v in 1 2 3; do g norm$v LOOM_NORM_VARIANT=$v; done
best=1; for v in 2 3; do awk "BEGIN{exit !(${MS[norm$v]:-999} < ${MS[norm$best]:-999})}" && best=$v; done
echo "best norm variant: $best"
g tuned LOOM_NORM_VARIANT=$best LOOM_BLAS_TUNE=1
grep -o 'blas: .*' "$OUT/g_tuned.err" | head -30
g base2 LOOM_FUSE_DGELU=0 LOOM_NORM_VARIANT=0
g all2 LOOM_NORM_VARIANT=$best
EXTRA="--profile 3" g prof LOOM_NORM_VARIANT=$best; grep -o '"breakdown_ms":{[^}]*}' "$OUT/g_prof.out"
el
export LOOM_NORM_VARIANT=$best
timeout 120 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1; echo "train rc=$?"; grep -E "^FAIL|passed|FAILED" "$OUT/train.log" | head -5
timeout 100 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" "dp=2,zero_stage=0;tp=2"
el
echo "1gpu: $(b 1)"
echo "dp2 pair: $(b 2)"
ddp
echo "dp2 pair: $(b 2)"
echo "1gpu: $(b 1)"
el
