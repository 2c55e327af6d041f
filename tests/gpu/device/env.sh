# Sourced by tests/gpu/call_*.sh (one device call each): the environment
# every GPU run gets. From the repository root; OUT (logs, default
# /tmp/loom-gpu) and BUILD (binaries carried there, default build-cuda) may
# be set by the caller. Sets BIN and t0; el prints seconds since t0; b and
# ddp run the GPT-2 124M comparison (below; scripts may redefine b).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export OUT=${OUT:-/tmp/loom-gpu} BUILD=${BUILD:-build-cuda}
mkdir -p "$OUT/dist"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
BIN=$BUILD/bin
# libnccl: the CUDA toolkit's copy where the image has one, else any other
if ldd "$BIN/loom-worker" | grep -q "libnccl.so.2 => not found"; then
    nl=$(find /usr/local /opt /usr/lib -name 'libnccl.so.2*' 2>/dev/null | head -1)
    [ -n "$nl" ] && export LD_LIBRARY_PATH=$(dirname "$nl"):$LD_LIBRARY_PATH
fi
t0=$(date +%s)
el() { echo "t=$(( $(date +%s) - t0 ))"; }
# GPT-2 124M, micro-batch 16, T 1024, ZeRO 0, 40 steps through loom-worker
# on $1 GPUs (dist_check.py bench): its tokens/s, step ms and exposed comm.
b() { timeout 150 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 124m 16 "$1" 0 40 | grep -o '"tokens_per_s": [0-9.]*, "step_ms": [0-9.]*, "comm_exposed_ms": [0-9.]*'; }
# PyTorch DDP compiled on 2 GPUs, same shapes (the peer script carried in
# .deps/peers): its RESULT line; logs $OUT/ddp$1.out/.err.
ddp() {
    PYTHONUNBUFFERED=1 timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
        .deps/peers/gpt2_torch_bench.py --model 124m --mbs 16 --mode ddp --compile 1 \
        >"$OUT/ddp${1:-}.out" 2>"$OUT/ddp${1:-}.err"
    echo "ddp rc=$?"
    grep -h '^RESULT' "$OUT/ddp${1:-}.out" || tail -5 "$OUT/ddp${1:-}.err"
}
