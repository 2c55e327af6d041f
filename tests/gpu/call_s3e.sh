#!/bin/bash
# Third session, repeat of the 124M comparison (2 GPUs): PyTorch DDP compiled
# twice, interleaved with Loom 1 GPU and dp2 (pair), to see the peer's spread.
. "$(dirname "$0")/call_env.sh"
b() { timeout 150 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 124m 16 "$1" 0 40 | grep -o '"tokens_per_s": [0-9.]*, "step_ms": [0-9.]*, "comm_exposed_ms": [0-9.]*'; }
ddp() { PYTHONUNBUFFERED=1 timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
    .deps/peers/gpt2_torch_bench.py --model 124m --mbs 16 --mode ddp --compile 1 \
    >"$OUT/ddp$1.out" 2>"$OUT/ddp$1.err"; echo "ddp rc=$?"; grep -h '^RESULT' "$OUT/ddp$1.out" || tail -5 "$OUT/ddp$1.err"; }
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
