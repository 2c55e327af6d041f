#!/bin/bash
# Fourth session (2 GPUs): the token embedding's gradient exchanged as
# per-token rows on the pair path (zero.c). The pair test with side
# messages; dp2 ZeRO 0's curve against 1 GPU with both ranks' final fp32
# weights hashed (must match); GPT-2 124M 1 GPU / dp2 with and without the
# exchange (LOOM_DP_EMB_EXCHANGE=0), a copy trace.
. "$(dirname "$0")/call_env.sh"
mkdir -p /tmp/cudnn && tar -C /tmp/cudnn -xJf .deps/cudnn.tar.xz
export LD_LIBRARY_PATH=/tmp/cudnn:$LD_LIBRARY_PATH
timeout 120 "$BIN/test_comm_nccl" >"$OUT/comm_nccl.log" 2>&1; echo "test_comm_nccl rc=$?"
grep -E "FAIL|side|passed" "$OUT/comm_nccl.log" | head -6
LOOM_DEBUG_PARAM_HASH=1 timeout 100 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" "dp=2,zero_stage=0"; echo "curves rc=$?"
grep -h "param hash\|per-token rows\|summed by" "$OUT"/dist/*.err | sed 's/.*info [a-z.]*:[0-9]*: //' | sort | uniq -c
el
echo "1gpu: $(b 1)"
echo "dp2 exchange: $(b 2)"
echo "dp2 dense: $(LOOM_DP_EMB_EXCHANGE=0 b 2)"
echo "dp2 exchange trace: $(LOOM_PAIR_TRACE=20 b 2)"
grep -h "pair trace" "$OUT"/dist/bench*2_z0*.err | grep "rank 0" | tail -5
echo "dp2 dense: $(LOOM_DP_EMB_EXCHANGE=0 b 2)"
echo "dp2 exchange: $(b 2)"
echo "1gpu: $(b 1)"
el
