#!/bin/bash
# Third session, first device call (2 GPUs): every correctness check of the
# committed tree (call_check.sh: the start-up order and pp_balance run on
# GPUs here first), then 1558M pp2 with the even and the balanced split.
. "$(dirname "$0")/call_env.sh"
tests/gpu/call_check.sh
el
d() { timeout 200 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" "$@" | grep -o '"extra": "[^"]*"\|"tokens_per_s": [0-9.]*\|"step_ms": [0-9.]*\|"mem_gib": [0-9.]*\|"bubble_frac": \[[^]]*\]' | tr '\n' ' '; echo; el; }
d 1558m 8 2 0 12 pp=2,accum=8
d 1558m 8 2 0 12 pp=2,accum=8,pp_balance=1
