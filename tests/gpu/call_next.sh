#!/bin/bash
# Device call planned for the next session (2 GPUs): first every correctness
# check (call_check.sh: the start-up order and pp_balance changes made after
# the last GPU call run here first), then what was built without a GPU:
# 1558M pp2 with the blocks split by work beside the even split, and 13.5B
# ZeRO-3 without offload (the planner says it fits 2 x H200).
. "$(dirname "$0")/call_env.sh"
tests/gpu/call_check.sh
el
d() { timeout 300 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" "$@" | grep -o '"extra": "[^"]*"\|"tokens_per_s": [0-9.]*\|"step_ms": [0-9.]*\|"mem_gib": [0-9.]*\|"bubble_frac": \[[^]]*\]' | tr '\n' ' '; echo; el; }
d 1558m 8 2 0 12 pp=2,accum=8
d 1558m 8 2 0 12 pp=2,accum=8,pp_balance=1
OMP_NUM_THREADS=16 d 13b 4 2 3 6 n_layer=42,n_head=40,d_model=5120,d_ff=20480,recompute=full,nosave=1,accum=2,timeout=300
