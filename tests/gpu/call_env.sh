# Sourced by tests/gpu/call_*.sh (one device call each): the environment
# every GPU run gets. From the repository root; OUT (logs, default
# /tmp/loom-gpu) and BUILD (binaries carried there, default build-cuda) may
# be set by the caller. Sets BIN and t0; el prints seconds since t0.
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
