#!/bin/bash
# Third session, repeat of the 124M comparison (2 GPUs): PyTorch DDP compiled
# twice, interleaved with Loom 1 GPU and dp2 (pair), to see the peer's spread.
. "$(dirname "$0")/call_env.sh"
ddp 1
el
echo "1gpu: $(b 1)"
echo "dp2 pair: $(b 2)"
el
ddp 2
el
echo "dp2 pair: $(b 2)"
echo "1gpu: $(b 1)"
el
