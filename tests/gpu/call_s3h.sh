#!/bin/bash
# Third session, last device call (2 GPUs): the committed defaults (one-pass
# norm backward, DGELU fusion, pair all-reduce): training test, curves, then
# GPT-2 124M 1 GPU / dp2 / PyTorch DDP compiled in the same call.
. "$(dirname "$0")/call_env.sh"
timeout 100 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1; echo "train rc=$?"; grep -E "^FAIL|passed|FAILED" "$OUT/train.log" | head -5
timeout 120 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" "dp=2,zero_stage=0;dp=2,zero_stage=3;pp=2;tp=2"
el
b() { timeout 150 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 124m 16 "$1" 0 40 | grep -o '"tokens_per_s": [0-9.]*, "step_ms": [0-9.]*, "comm_exposed_ms": [0-9.]*'; }
echo "1gpu: $(b 1)"
echo "dp2: $(b 2)"
PYTHONUNBUFFERED=1 timeout 200 python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
    .deps/peers/gpt2_torch_bench.py --model 124m --mbs 16 --mode ddp --compile 1 \
    >"$OUT/ddp.out" 2>"$OUT/ddp.err"; echo "ddp rc=$?"; grep -h '^RESULT' "$OUT/ddp.out" || tail -5 "$OUT/ddp.err"
echo "dp2: $(b 2)"
echo "1gpu: $(b 1)"
el
