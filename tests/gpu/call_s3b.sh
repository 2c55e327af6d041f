#!/bin/bash
# Third session, second device call (2 GPUs): the copy-engine pair all-reduce
# (worker/nccl/pair.h): its comm test, the dp2 ZeRO-0 curve with it, then
# GPT-2 124M 1 GPU / dp2 pair / dp2 NCCL (LOOM_DP_PAIR=0) / dp2 pair again.
. "$(dirname "$0")/call_env.sh"
timeout 120 "$BIN/test_comm_nccl" >"$OUT/comm_nccl.log" 2>&1; echo "test_comm_nccl rc=$?"
grep -E "CHECK|pair|test_comm_nccl" "$OUT/comm_nccl.log" | head -20
el
timeout 100 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" "dp=2,zero_stage=0"
grep -h "copy engines\|pair" "$OUT"/dist/*.err 2>/dev/null | head -3
el
echo "1gpu: $(b 1)"
echo "dp2 pair: $(b 2)"
grep -h "copy engines\|pair" "$OUT"/dist/bench*.err 2>/dev/null | head -2
echo "dp2 nccl: $(LOOM_DP_PAIR=0 b 2)"
echo "dp2 pair: $(b 2)"
el
