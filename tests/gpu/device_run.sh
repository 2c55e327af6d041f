#!/bin/bash
# One call on the GPU machine (built here, carried there): the gpu-labelled
# tests, compute-sanitizer memcheck and racecheck on the kernel test, then
# the benchmark against PyTorch. Full logs go to $OUT (or /tmp/loom-gpu);
# stdout ends with a short summary.
# Usage (repo root): tests/gpu/device_run.sh [tests|bench|all|dist|big|cluster]
#   dist (2 GPUs): kernel test, NCCL comm test, dp2 zero 0-3 loss curves vs
#        1 GPU (tests/gpu/dist_check.py), all-reduce bus bandwidth through
#        the comm layer and through torch.distributed, GPT-2 124M 1-GPU
#        (Loom + peer) and dp2 (loom-worker zero 0 + peer DDP).
#   big  (2 GPUs): GPT-2 1558M mbs 8: 1-GPU (Loom + peer), dp2 zero 3
#        (loom-worker + peer FSDP2).
#   cluster (2 GPUs): tests/gpu/cluster_gpu.py (loomd + agent + a dp2 job
#        over HTTP, GPU telemetry, a killed rank retried from its checkpoint).
#   LAYOUTS="dp=2,zero_stage=0;tp=2;pp=2" overrides dist's curve layouts
#   (default: dp2 zero 0-3, pp2, tp2).
set -u
cd "$(dirname "$0")/../.."
what=${1:-all}
OUT=${OUT:-/tmp/loom-gpu}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}
BIN=${BUILD:-build-cuda}/bin
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv \
    | tee "$OUT/gpu.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/gpu.txt"
# libnccl: the CUDA toolkit's copy where the image has one, else torch's pip copy
if ldd "$BIN/loom-worker" | grep -q "libnccl.so.2 => not found"; then
    nl=$(find /usr/local /opt /usr/lib -name 'libnccl.so.2*' 2>/dev/null | head -1)
    [ -n "$nl" ] && export LD_LIBRARY_PATH=$(dirname "$nl"):$LD_LIBRARY_PATH
    echo "libnccl from: ${nl:-nowhere}"
fi
for b in test_gpu_kernels test_gpu_train loom-gpu-bench loom-worker test_comm_nccl bench_nccl_allreduce; do
    ldd "$BIN/$b" | grep "not found" && echo "MISSING LIBS for $b"
done
summary=""
PEER=${PEER:-.deps/peers/gpt2_torch_bench.py}
TORCHRUN="python3 -m torch.distributed.run --standalone --nproc_per_node=2"
# peer in DDP / FSDP2 mode on 2 GPUs: prints its RESULT line
peer2() {
    PYTHONUNBUFFERED=1 timeout 400 $TORCHRUN "$PEER" --model "$1" --mbs "$2" --mode "$3" \
        --compile 1 >"$OUT/peer_$1_$3.out" 2>"$OUT/peer_$1_$3.err"
    echo "peer $1 $3 rc=$?"
    grep -h '^RESULT' "$OUT/peer_$1_$3.out" || tail -15 "$OUT/peer_$1_$3.err"
}
if [ "$what" = dist ]; then
    timeout 240 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1
    rc=$?
    grep -E "^FAIL|checks passed" "$OUT/kernels.log" | head -20
    summary="$summary kernels=$rc"
    timeout 120 "$BIN/test_comm_nccl" >"$OUT/comm_nccl.log" 2>&1
    rc=$?
    tail -5 "$OUT/comm_nccl.log"
    summary="$summary comm_nccl=$rc"
    mkdir -p "$OUT/dist"
    timeout 300 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" \
        "${LAYOUTS:-dp=2,zero_stage=0;dp=2,zero_stage=1;dp=2,zero_stage=2;dp=2,zero_stage=3;pp=2;tp=2}"
    summary="$summary curves=$?"
    timeout 120 "$BIN/bench_nccl_allreduce" --max-mb 1024 --iters 20 >"$OUT/ar_loom.out" \
        2>"$OUT/ar_loom.err"
    echo "bench_nccl_allreduce rc=$?"; cat "$OUT/ar_loom.out"; tail -3 "$OUT/ar_loom.err"
    timeout 150 $TORCHRUN tests/gpu/torch_allreduce.py 1024 20 >"$OUT/ar_torch.out" \
        2>"$OUT/ar_torch.err"
    echo "torch_allreduce rc=$?"; cat "$OUT/ar_torch.out"; grep -v Warning "$OUT/ar_torch.err" | tail -3
    timeout 300 tests/bench/gpu_bench.sh 124m 16 1024 2>&1 | tee "$OUT/bench.log" | tail -12
    timeout 200 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 124m 16 2 0 40
    peer2 124m 16 ddp
    # A/B (Loom only): host sync before each collective instead of the device
    # fence, and fewer NCCL channels (less SM time taken from compute)
    for v in LOOM_COMM_ORDER=sync NCCL_MAX_NCHANNELS=16 NCCL_MAX_NCHANNELS=8; do
        echo "A/B $v:"
        env "$v" timeout 120 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 124m 16 2 0 30
    done
fi
if [ "$what" = big ]; then
    timeout 300 tests/bench/gpu_bench.sh 1558m 8 1024 >"$OUT/bench1558.log" 2>&1
    grep -E "RESULT|ratio|rc=|^loom |^torch " "$OUT/bench1558.log" | tail -10
    mkdir -p "$OUT/dist"
    timeout 300 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 1558m 8 2 3 24
    peer2 1558m 8 fsdp
fi
if [ "$what" = cluster ]; then
    # loomd + loom-agent (NVML inventory) + a dp2 job over HTTP, telemetry, kill and resume
    timeout 400 python3 tests/gpu/cluster_gpu.py "$BIN" 2>&1 | tail -20
    summary="$summary cluster=${PIPESTATUS[0]}"
fi
if [ "$what" = dist ] || [ "$what" = big ] || [ "$what" = cluster ]; then
    echo "SUMMARY:$summary"
    exit 0
fi
if [ "$what" != bench ]; then
    timeout 240 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1
    rc=$?
    grep -E "^FAIL|checks passed|seed" "$OUT/kernels.log"
    summary="$summary kernels=$rc"
    timeout 300 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1
    rc=$?
    grep -E "^(ok|FAIL)|passed|FAILED" "$OUT/train.log"
    summary="$summary train=$rc"
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [ -n "$cs" ]; then
        for tool in memcheck racecheck; do
            LOOM_TEST_QUICK=1 timeout 240 "$cs" --tool "$tool" --error-exitcode 9 \
                "$BIN/test_gpu_kernels" >"$OUT/$tool.log" 2>&1
            rc=$?
            grep -E "ERROR SUMMARY|RACECHECK SUMMARY|checks passed" "$OUT/$tool.log" | tail -3
            summary="$summary $tool=$rc"
        done
    else
        summary="$summary sanitizer=not-found"
    fi
fi
if [ "$what" = all ] || [ "$what" = tune ]; then
    # attention kernel variants (speed only): the worker runs the chosen one;
    # bench_attn times every variant of dev/cuda in one process
    "$BIN/bench_attn" >"$OUT/bench_attn.out" 2>&1
    grep -E '^RESULT|^ok|^FAIL' "$OUT/bench_attn.out" | head -20
    nc=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    if [ -n "$nc" ] && [ "${NCU:-0}" = 1 ]; then
        timeout 180 "$nc" --clock-control none -k regex:'attn|xent|norm|gelu|adamw' \
            --launch-skip 40 --launch-count 12 --section SpeedOfLight --section Occupancy \
            --section WarpStateStats --section LaunchStats \
            "$BIN/loom-gpu-bench" --steps 1 --warmup 1 --profile 0 >"$OUT/ncu.txt" 2>&1
        grep -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per" \
            "$OUT/ncu.txt" | head -60
    fi
fi
if [ "$what" != tests ] && [ "$what" != tune ]; then
    tests/bench/gpu_bench.sh 124m 16 1024 2>&1 | tee "$OUT/bench.log" | tail -30
    if [ "${BIG:-0}" = 1 ]; then
        timeout 300 tests/bench/gpu_bench.sh 1558m 8 1024 >"$OUT/bench1558.log" 2>&1
        grep -E "GPU time|^  |RESULT|ratio|rc=|^loom |^torch " "$OUT/bench1558.log" | tail -16
    fi
fi
echo "SUMMARY:$summary"
