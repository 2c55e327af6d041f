#!/bin/bash
# Third session, last device call (2 GPUs): the committed defaults (one-pass
# norm backward, DGELU fusion, pair all-reduce): training test, curves, then
# GPT-2 124M 1 GPU / dp2 / PyTorch DDP compiled in the same call.
. "$(dirname "$0")/call_env.sh"
timeout 100 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1; echo "train rc=$?"; grep -E "^FAIL|passed|FAILED" "$OUT/train.log" | head -5
timeout 120 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" "dp=2,zero_stage=0;dp=2,zero_stage=3;pp=2;tp=2"
el
echo "1gpu: $(b 1)"
echo "dp2: $(b 2)"
ddp
echo "dp2: $(b 2)"
echo "1gpu: $(b 1)"
el
