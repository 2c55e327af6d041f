#!/bin/bash
# Fourth session, third device call (2 GPUs), defaults with cuDNN attention:
# training test, every 2-GPU layout's curve, the control-plane GPU job, then
# GPT-2 124M 1 GPU / dp2 ZeRO 0 / dp2 ZeRO 1 / PyTorch DDP compiled and
# GPT-2 1558M 1 GPU / dp2 ZeRO 3, all in this call.
. "$(dirname "$0")/call_env.sh"
mkdir -p /tmp/cudnn && tar -C /tmp/cudnn -xJf .deps/cudnn.tar.xz
export LD_LIBRARY_PATH=/tmp/cudnn:$LD_LIBRARY_PATH
timeout 100 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1; echo "train rc=$?"; grep -E "^FAIL|passed|FAILED" "$OUT/train.log" | head -5
timeout 200 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" \
    "dp=2,zero_stage=0;dp=2,zero_stage=1;dp=2,zero_stage=2;dp=2,zero_stage=3;pp=2;tp=2"; echo "curves rc=$?"
grep -rh "attention through" "$OUT/dist" | sed 's/.*cuda backend: //' | sort | uniq -c | head -4
el
timeout 200 python3 tests/gpu/cluster_gpu.py "$BIN" >"$OUT/cluster.log" 2>&1; echo "cluster rc=$?"
tail -4 "$OUT/cluster.log"; grep -rh "attention through" /tmp/loom-* "$OUT" 2>/dev/null | sed 's/.*cuda backend: //' | sort | uniq -c | head -3
el
echo "1gpu: $(b 1)"
echo "dp2 z0: $(b 2)"
echo "dp2 z1: $(timeout 150 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 124m 16 2 1 40 | grep -o '"tokens_per_s": [0-9.]*, "step_ms": [0-9.]*, "comm_exposed_ms": [0-9.]*')"
ddp
echo "dp2 z0: $(b 2)"
echo "1gpu: $(b 1)"
el
x() { timeout 200 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 1558m 8 "$@" | grep -o '"tokens_per_s": [0-9.]*, "step_ms": [0-9.]*, "comm_exposed_ms": [0-9.]*'; }
echo "1558m 1gpu: $(x 1 0 12)"
echo "1558m dp2 z3: $(x 2 3 16)"
echo "1558m 1gpu: $(x 1 0 12)"
el
