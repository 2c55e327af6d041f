#!/bin/bash
# Device call: tp2 curve and throughput with the tp all-reduce on the compute
# stream (A/B against the comm-thread path), then GPT-2 124M 1 GPU / dp2
# beside PyTorch DDP, all in one call.
. "$(dirname "$0")/call_env.sh"
timeout 100 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" "tp=2;dp=2,zero_stage=0"
X=n_layer=48,n_head=26,d_model=1664,d_ff=6656
d() { timeout 200 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" "$@" | grep -o '"nproc": [0-9]*\|"extra": "[^"]*"\|"tokens_per_s": [0-9.]*\|"step_ms": [0-9.]*\|"comm_exposed_ms": [0-9.]*\|"mfu": [0-9.]*' | tr '\n' ' '; echo " t=$(( $(date +%s) - t0 ))"; }
d xl26 8 2 0 20 tp=2,$X
LOOM_TP_STREAM=0 d xl26 8 2 0 20 tp=2,$X
d xl26 8 1 0 20 $X
d 124m 16 1 0 40
d 124m 16 2 0 40
PYTHONUNBUFFERED=1 timeout 200 python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
    .deps/peers/gpt2_torch_bench.py --model 124m --mbs 16 --mode ddp --compile 1 \
    >"$OUT/ddp.out" 2>"$OUT/ddp.err"; echo "ddp rc=$?"; grep -h '^RESULT' "$OUT/ddp.out" || tail -5 "$OUT/ddp.err"
d 124m 16 2 0 40
el
