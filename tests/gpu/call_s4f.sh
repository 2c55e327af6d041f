#!/bin/bash
# Fourth session, last device call (2 GPUs), the committed tree: kernel tests
# with cuDNN, then without it on the loader path (the fallback: k_attn.cu,
# "NOT RUN" for the cuDNN cases, the worker's log line), then GPT-2 124M
# 1 GPU / dp2 / PyTorch DDP compiled in the same call.
. "$(dirname "$0")/call_env.sh"
mkdir -p /tmp/cudnn && tar -C /tmp/cudnn -xJf .deps/cudnn.tar.xz
plain=$LD_LIBRARY_PATH
export LD_LIBRARY_PATH=/tmp/cudnn:$plain
timeout 150 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1; echo "kernels (cuDNN) rc=$?"
grep -cE "cudnn" "$OUT/kernels.log"; grep -E "^FAIL|checks passed|NOT RUN" "$OUT/kernels.log" | head -5
LD_LIBRARY_PATH=$plain LOOM_TEST_QUICK=1 timeout 100 "$BIN/test_gpu_kernels" >"$OUT/kernels_nocudnn.log" 2>&1
echo "kernels (no cuDNN) rc=$?"; grep -E "^FAIL|checks passed|NOT RUN" "$OUT/kernels_nocudnn.log" | head -5
echo "1gpu no cuDNN: $(LD_LIBRARY_PATH=$plain b 1)"
grep -rh "attention through" "$OUT/dist" | sed 's/.*cuda backend: //' | sort | uniq -c
el
echo "1gpu: $(b 1)"
echo "dp2: $(b 2)"
ddp
echo "dp2: $(b 2)"
echo "1gpu: $(b 1)"
el
