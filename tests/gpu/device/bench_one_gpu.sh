#!/bin/bash
# One-GPU throughput beside the PyTorch peers, in one call: GPT-2 124M
# (tests/bench/gpu_bench.sh: loom-gpu-bench, loom-worker end to end, the
# compiled peer) and the Llama 3.2 1B shape at T 2048, micro-batch 4
# (loom-gpu-bench --family llama against llama_torch_bench.py, compiled).
# Usage: tests/gpu/device/bench_one_gpu.sh   (BUILD: the carried build folder;
# the peers in .deps/peers). Logs under $OUT.
. "$(dirname "$0")/env.sh"
BUILD=$BUILD timeout 330 tests/bench/gpu_bench.sh 124m 16 1024 >"$OUT/gpt2_124m.log" 2>&1
echo "gpt2 124m rc=$? $(el)"
grep -E "RESULT|ratio|^loom |^torch " "$OUT/gpt2_124m.log" | tail -8
timeout 150 "$BIN/loom-gpu-bench" --family llama --model "${LLAMA:-1b}" --mbs 4 --T 2048 \
    >"$OUT/llama_loom.out" 2>"$OUT/llama_loom.err"
echo "loom llama ${LLAMA:-1b} rc=$? $(el)"
grep '^RESULT' "$OUT/llama_loom.out" || tail -5 "$OUT/llama_loom.err"
grep -h -m1 "attention through" "$OUT/llama_loom.err"
# the attention kernels alone on the Llama shapes (k_attn.cu's and cuDNN's)
timeout 120 "$BIN/bench_attn" 10 >"$OUT/bench_attn.out" 2>&1
echo "bench_attn rc=$? $(el)"
grep '^RESULT' "$OUT/bench_attn.out" | grep llama | grep -E '"variant":"(5|cudnn|cudnn-nd)"'
timeout 60 "$BIN/bench_elem" 20 >"$OUT/bench_elem.out" 2>&1
echo "bench_elem rc=$? $(el)"
grep '^RESULT' "$OUT/bench_elem.out"
PYTHONUNBUFFERED=1 timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node=1 \
    .deps/peers/llama_torch_bench.py --model "${LLAMA:-1b}" --mbs 4 --T 2048 \
    >"$OUT/llama_peer.out" 2>"$OUT/llama_peer.err"
echo "peer llama ${LLAMA:-1b} rc=$? $(el)"
grep -h '^RESULT' "$OUT/llama_peer.out" || tail -5 "$OUT/llama_peer.err"
