#!/bin/bash
# Fourth session, first device call (2 GPUs): cuDNN fused attention
# (worker/cuda/cudnn_attn.c, libcudnn 9.19 carried in .deps/cudnn.tar.xz):
# micro-benchmark beside k_attn.cu, kernel tests, then GPT-2 124M 1 GPU /
# dp2 with cuDNN attention and with LOOM_ATTN_CUDNN=0, PyTorch DDP compiled.
. "$(dirname "$0")/call_env.sh"
mkdir -p /tmp/cudnn && tar -C /tmp/cudnn -xJf .deps/cudnn.tar.xz
export LD_LIBRARY_PATH=/tmp/cudnn:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 120 "$BIN/bench_attn" 20 2>&1 | tee "$OUT/attn.log" | cut -c1-400
el
timeout 100 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1; echo "train rc=$?"; grep -E "^FAIL|passed|FAILED|attention" "$OUT/train.log" | head -8
timeout 150 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1; echo "kernels rc=$?"
grep -E "cudnn|NOT RUN|^FAIL|passed|checks" "$OUT/kernels.log" | head -30
el
echo "1gpu cudnn: $(b 1)"
grep -rh "attention through" "$OUT/dist" | sort | uniq -c | head -3
echo "dp2 cudnn: $(b 2)"
echo "1gpu k_attn: $(LOOM_ATTN_CUDNN=0 b 1)"
echo "dp2 k_attn: $(LOOM_ATTN_CUDNN=0 b 2)"
el
ddp
echo "dp2 cudnn: $(b 2)"
echo "1gpu cudnn: $(b 1)"
el
