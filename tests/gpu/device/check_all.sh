#!/bin/bash
# Correctness of the built tree on the GPU machine (2 GPUs), in one go.
# Usage: tests/gpu/device/check_all.sh [PART...]   (default: libs kernels
#        train curves cluster memcheck)
# Parts:
#   libs      every binary finds its shared libraries (ldd)
#   kernels   test_gpu_kernels (every backend op against the cpu backend)
#   train     test_gpu_train (GPT-2 / Llama curves vs cpu, determinism,
#             bit-exact resume, optimizer offload vs on-device)
#   comm      test_comm_nccl (collectives, the copy-engine pair all-reduce
#             and its side messages, a killed peer)
#   curves    every 2-GPU layout's 50-step loss curve against the 1-GPU run
#             (dist_check.py curves; ZeRO-0 dp ranks must end bit-identical);
#             LAYOUTS="dp=2,zero_stage=0;tp=2" overrides the layouts
#   cluster   a 2-GPU job through loomd + loom-agent (cluster_gpu.py)
#   memcheck  compute-sanitizer memcheck on the quick kernel set
#   racecheck compute-sanitizer racecheck on the quick kernel set
# Env: CUDNN=1 (see env.sh). Summary line "SUMMARY: part=rc ..." on stdout,
# logs under $OUT.
. "$(dirname "$0")/env.sh"
DEFAULT_LAYOUTS="dp=2,zero_stage=0;dp=2,zero_stage=1;dp=2,zero_stage=2;dp=2,zero_stage=3;pp=2;pp=2,pp_balance=1;tp=2"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(libs kernels train curves cluster memcheck)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
git log --oneline -1 2>/dev/null
s=""
sanitizer() { # TOOL: compute-sanitizer TOOL on the quick kernel set
    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [ -z "$cs" ]; then
        echo "$1: compute-sanitizer not found"
        s="$s $1=not-found"
        return
    fi
    LOOM_TEST_QUICK=1 timeout 240 "$cs" --tool "$1" --error-exitcode 9 "$BIN/test_gpu_kernels" \
        >"$OUT/$1.log" 2>&1
    local r=$?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|checks passed" "$OUT/$1.log" | tail -3
    s="$s $1=$r"
}
for p in "${parts[@]}"; do
    case $p in
    libs)
        m=0
        for b in loomd loom-agent loom-worker test_gpu_kernels test_gpu_train test_comm_nccl; do
            [ -e "$BIN/$b" ] || continue
            ldd "$BIN/$b" | grep "not found" && m=1 && echo "missing libraries for $b"
        done
        s="$s libs=$m"
        ;;
    kernels)
        timeout 300 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1
        r=$?
        grep -E "^FAIL|checks passed|NOT RUN" "$OUT/kernels.log" | head -20
        s="$s kernels=$r"
        ;;
    train)
        timeout 300 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1
        r=$?
        grep -E "^FAIL|passed|FAILED|offload|attention" "$OUT/train.log" | head -20
        s="$s train=$r"
        ;;
    comm)
        timeout 120 "$BIN/test_comm_nccl" >"$OUT/comm_nccl.log" 2>&1
        r=$?
        grep -E "FAIL|CHECK|pair|side|passed|test_comm_nccl" "$OUT/comm_nccl.log" | head -20
        s="$s comm=$r"
        ;;
    curves)
        timeout 300 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" \
            "${LAYOUTS:-$DEFAULT_LAYOUTS}"
        s="$s curves=$?"
        grep -h "attention through\|copy engines\|per-token rows" "$OUT"/dist/lay_*.err 2>/dev/null |
            sed 's/.*info [a-z._]*:[0-9]*: //' | sort | uniq -c | head -6
        ;;
    cluster)
        timeout 400 python3 tests/gpu/cluster_gpu.py "$BIN" >"$OUT/cluster.log" 2>&1
        r=$?
        tail -12 "$OUT/cluster.log"
        s="$s cluster=$r"
        ;;
    memcheck | racecheck) sanitizer "$p" ;;
    *)
        echo "check_all.sh: unknown part '$p'" >&2
        exit 2
        ;;
    esac
    el
done
echo "SUMMARY:$s"
