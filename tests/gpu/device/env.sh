# shellcheck shell=bash
# Sourced by every script in tests/gpu/device/: the environment each GPU run
# gets. Run the scripts from anywhere; they cd to the repository root.
# Caller settings:
#   OUT    logs (default /tmp/loom-gpu)
#   BUILD  the build folder whose bin/ was carried (default build-cuda)
#   CUDNN=1  unpack .deps/cudnn.tar.xz (libcudnn 9 from the toolkit) into
#          /tmp/cudnn and put it first on LD_LIBRARY_PATH; PLAIN_LD_LIBRARY_PATH
#          keeps the path without it (NOCUDNN=1 in with_vars: the fallback runs)
#   MODEL, MBS, ZERO, STEPS  the shape of `worker_bench` and the PyTorch peer
#          (default GPT-2 124m, micro-batch 16, ZeRO 0, 40 steps; T is 1024)
# Defines BIN, t0, el (seconds since t0), worker_bench NPROC, peer_torch MODE
# [TAG] and with_vars "A=1,B=2" CMD... (CMD with those variables set).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.." || exit 1
export OUT=${OUT:-/tmp/loom-gpu} BUILD=${BUILD:-build-cuda}
mkdir -p "$OUT/dist"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
BIN=$BUILD/bin
# libnccl: the CUDA toolkit's copy where the image has one, else any other
if ldd "$BIN/loom-worker" 2>/dev/null | grep -q "libnccl.so.2 => not found"; then
    nl=$(find /usr/local /opt /usr/lib -name 'libnccl.so.2*' 2>/dev/null | head -1)
    [ -n "$nl" ] && LD_LIBRARY_PATH=$(dirname "$nl"):$LD_LIBRARY_PATH
fi
export PLAIN_LD_LIBRARY_PATH=$LD_LIBRARY_PATH
if [ "${CUDNN:-0}" = 1 ]; then
    mkdir -p /tmp/cudnn && tar -C /tmp/cudnn -xJf .deps/cudnn.tar.xz
    export LD_LIBRARY_PATH=/tmp/cudnn:$PLAIN_LD_LIBRARY_PATH
fi
MODEL=${MODEL:-124m} MBS=${MBS:-16} ZERO=${ZERO:-0} STEPS=${STEPS:-40}
PEER=${PEER:-.deps/peers/gpt2_torch_bench.py}
t0=$(date +%s)
el() { echo "t=$(($(date +%s) - t0))"; }
# with_vars "A=1,B=2" CMD...: CMD (a program or a function of these
# scripts) in a subshell with A and B exported ("" sets nothing); NOCUDNN=1
# among them takes the carried libcudnn off the loader path for CMD
with_vars() {
    local vars=$1
    shift
    (
        if [ -n "$vars" ]; then
            IFS=, read -ra kvs <<<"$vars"
            for kv in "${kvs[@]}"; do export "${kv?}"; done
        fi
        [ "${NOCUDNN:-0}" = 1 ] && export LD_LIBRARY_PATH=$PLAIN_LD_LIBRARY_PATH
        "$@"
    )
}
# worker_bench NPROC: loom-worker end to end on NPROC GPUs (dist_check.py
# bench; MODEL, MBS, ZERO, STEPS; median of the steps after the 8th): its
# tokens/s, step ms and exposed communication ms.
worker_bench() {
    timeout "${TIMEOUT:-200}" python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" \
        "$MODEL" "$MBS" "$1" "$ZERO" "$STEPS" |
        grep -o '"tokens_per_s": [0-9.]*, "step_ms": [0-9.]*, "comm_exposed_ms": [0-9.]*'
}
# peer_torch MODE [TAG]: the PyTorch peer (torch.compile, bf16) on 2 GPUs in
# MODE ddp or fsdp, same MODEL and MBS: its RESULT line; logs
# $OUT/peer_MODE[TAG].out/.err.
peer_torch() {
    local log=$OUT/peer_$1${2:-}
    PYTHONUNBUFFERED=1 timeout 400 python3 -m torch.distributed.run --standalone \
        --nproc_per_node=2 "$PEER" --model "$MODEL" --mbs "$MBS" --mode "$1" --compile 1 \
        >"$log.out" 2>"$log.err"
    echo "peer $1 rc=$?"
    grep -h '^RESULT' "$log.out" || tail -5 "$log.err"
}
