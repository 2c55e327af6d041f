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
b() { timeout 150 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 124m 16 "$1" 0 40 | grep -o '"tokens_per_s": [0-9.]*, "step_ms": [0-9.]*, "comm_exposed_ms": [0-9.]*'; }
echo "1gpu: $(b 1)"
echo "dp2 pair: $(LOOM_PAIR_TRACE=12 b 2)"
grep -h "pair trace" "$OUT"/dist/bench*2_z0*.err | grep "rank 0" | tail -12
echo "dp2 nccl: $(LOOM_DP_PAIR=0 b 2)"
echo "dp2 pair: $(b 2)"
el
PYTHONUNBUFFERED=1 timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
    .deps/peers/gpt2_torch_bench.py --model 124m --mbs 16 --mode ddp --compile 1 \
    >"$OUT/ddp.out" 2>"$OUT/ddp.err"; echo "ddp rc=$?"; grep -h '^RESULT' "$OUT/ddp.out" || tail -5 "$OUT/ddp.err"
el
echo "1gpu: $(b 1)"
echo "dp2 pair: $(b 2)"
echo "dp2 nccl: $(LOOM_DP_PAIR=0 b 2)"
el
