#!/bin/bash
# Device call: GPT-2 1558M through loom-worker on one GPU, tp2 and pp2 (1F1B,
# 8 micro-batches), on two GPUs: tokens/s, bubble, exposed communication.
set -u
cd "$(dirname "$0")/../.."
export OUT=${OUT:-/tmp/loom-gpu} BUILD=${BUILD:-build-cuda}
mkdir -p "$OUT/dist"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
BIN=$BUILD/bin
t0=$(date +%s)
d() { timeout 300 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 1558m "$@" | grep RESULT; echo "t=$(( $(date +%s) - t0 ))"; }
d 8 1 0 20
d 8 2 0 20 tp=2
d 8 2 0 12 pp=2,accum=8
d 8 2 1 12 accum=4
