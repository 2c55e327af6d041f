#!/bin/bash
# Fourth session, last device call (2 GPUs), the committed tree (cuDNN
# attention, token embedding exchanged as rows): GPT-2 124M 1 GPU / dp2 /
# PyTorch DDP compiled in one call.
. "$(dirname "$0")/call_env.sh"
mkdir -p /tmp/cudnn && tar -C /tmp/cudnn -xJf .deps/cudnn.tar.xz
export LD_LIBRARY_PATH=/tmp/cudnn:$LD_LIBRARY_PATH
echo "1gpu: $(b 1)"
echo "dp2: $(b 2)"
ddp
echo "dp2: $(b 2)"
echo "1gpu: $(b 1)"
el
