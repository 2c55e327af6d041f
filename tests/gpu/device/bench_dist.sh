#!/bin/bash
# Device call: GPT-2 1558M through loom-worker on one GPU, tp2 and pp2 (1F1B,
# 8 micro-batches), on two GPUs: tokens/s, bubble, exposed communication.
. "$(dirname "$0")/call_env.sh"
d() { timeout 300 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 1558m "$@" | grep RESULT; el; }
d 8 1 0 20
d 8 2 0 20 tp=2
d 8 2 0 12 pp=2,accum=8
d 8 2 1 12 accum=4
