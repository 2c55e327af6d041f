#!/bin/bash
# Device call: GPT-2 124M dp2 throughput A/B (loom-worker, 1 GPU and 2),
# beside PyTorch DDP in the same call. Args: VARIANTS as "NAME=VAL ..." sets.
. "$(dirname "$0")/call_env.sh"
STEPS=${STEPS:-40}
b() { timeout 200 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 124m 16 "$1" ${ZERO:-0} $STEPS | grep -o '"tokens_per_s": [0-9.]*, "step_ms": [0-9.]*, "comm_exposed_ms": [0-9.]*'; }
[ -x "$BIN/bench_adamw" ] && timeout 60 "$BIN/bench_adamw" | grep -E "RESULT|differ"
echo "1gpu: $(b 1)"
echo "1gpu LOOM_ADAMW_VARIANT=0: $(LOOM_ADAMW_VARIANT=0 b 1)"
echo "dp2: $(b 2)"
for v in "$@"; do echo "dp2 $v: $(env $v bash -c "$(declare -f b); BIN=$BIN OUT=$OUT STEPS=$STEPS b 2")"; done
el
if [ "${PEER:-1}" = 1 ]; then
    PYTHONUNBUFFERED=1 timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
        .deps/peers/gpt2_torch_bench.py --model 124m --mbs 16 --mode ddp --compile 1 \
        >"$OUT/ddp.out" 2>"$OUT/ddp.err"; echo "ddp rc=$?"; grep -h '^RESULT' "$OUT/ddp.out" || tail -5 "$OUT/ddp.err"
fi
echo "dp2 again: $(b 2)"
el
