#!/bin/bash
# Third session, final device call (2 GPUs): every correctness check of the
# tree (call_check.sh, with the chunked pair all-reduce and the new attention
# defaults), the pair comm test, then GPT-2 124M: 1 GPU, dp2 (pair), dp2 NCCL
# (LOOM_DP_PAIR=0) and PyTorch DDP compiled in the same call.
. "$(dirname "$0")/call_env.sh"
tests/gpu/call_check.sh
timeout 120 "$BIN/test_comm_nccl" >"$OUT/comm_nccl.log" 2>&1; echo "test_comm_nccl rc=$?"
grep -E "CHECK|test_comm_nccl" "$OUT/comm_nccl.log" | head -10
el
echo "1gpu: $(b 1)"
echo "dp2 pair: $(LOOM_PAIR_TRACE=12 b 2)"
grep -h "pair trace" "$OUT"/dist/bench*2_z0*.err | grep "rank 0" | tail -12
echo "dp2 nccl: $(LOOM_DP_PAIR=0 b 2)"
echo "dp2 pair: $(b 2)"
el
ddp
el
echo "1gpu: $(b 1)"
echo "dp2 pair: $(b 2)"
echo "dp2 nccl: $(LOOM_DP_PAIR=0 b 2)"
el
