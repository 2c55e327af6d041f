#!/bin/bash
# All-reduce bus bandwidth on two GPUs: Loom's comm layer on NCCL
# (bench_nccl_allreduce) beside torch.distributed (tests/gpu/torch_allreduce.py),
# same sizes (1 MiB to MAX_MB, default 1024), in-place f32 sum, median of
# ITERS (default 20) blocking calls each.
# Usage: tests/gpu/device/bench_comm.sh
. "$(dirname "$0")/env.sh"
max=${MAX_MB:-1024} iters=${ITERS:-20}
timeout 120 "$BIN/bench_nccl_allreduce" --max-mb "$max" --iters "$iters" >"$OUT/ar_loom.out" \
    2>"$OUT/ar_loom.err"
echo "bench_nccl_allreduce rc=$?"
cat "$OUT/ar_loom.out"
tail -3 "$OUT/ar_loom.err"
timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
    tests/gpu/torch_allreduce.py "$max" "$iters" >"$OUT/ar_torch.out" 2>"$OUT/ar_torch.err"
echo "torch_allreduce rc=$?"
cat "$OUT/ar_torch.out"
grep -v Warning "$OUT/ar_torch.err" | tail -3
el
