#!/bin/bash
# Third session, third device call (2 GPUs): pair all-reduce with the split
# copies (two copy engines) and the loss all-reduce moved behind AdamW:
# comm test, curves (every layout's collective order moved), then GPT-2 124M
# 1 GPU / dp2 pair / dp2 pair one stream / dp2 NCCL, copy trace at step 12.
. "$(dirname "$0")/call_env.sh"
timeout 120 "$BIN/test_comm_nccl" >"$OUT/comm_nccl.log" 2>&1; echo "test_comm_nccl rc=$?"
grep -E "CHECK|test_comm_nccl" "$OUT/comm_nccl.log" | head -10
el
timeout 150 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" "dp=2,zero_stage=0;dp=2,zero_stage=1;dp=2,zero_stage=3;pp=2;tp=2"
el
echo "1gpu: $(b 1)"
echo "dp2 pair: $(LOOM_PAIR_TRACE=12 b 2)"
grep -h "pair trace" "$OUT"/dist/bench*2_z0*.err | head -40
echo "dp2 pair 1 stream: $(LOOM_PAIR_SPLIT_KIB=0 LOOM_PAIR_TRACE=12 b 2)"
grep -h "pair trace" "$OUT"/dist/bench*2_z0*.err | grep "rank 0" | head -20
echo "dp2 nccl: $(LOOM_DP_PAIR=0 b 2)"
echo "1gpu: $(b 1)"
echo "dp2 pair: $(b 2)"
el
