#!/bin/bash
# Throughput of loom-worker layouts on two GPUs for models larger than
# GPT-2 124M: tp2, pp2 (1F1B, even or balanced split), dp2 with ZeRO 1-3,
# optimizer offload, the largest models the GPUs and the host hold.
# Usage: tests/gpu/device/bench_dist.sh RUN...
# A RUN is a suite name below or one dist_check.py bench line in quotes,
# "[VAR=VAL ...] MODEL MBS NPROC ZERO STEPS [EXTRA]", e.g.
#   "1558m 8 2 0 12 pp=2,accum=8"  or  "LOOM_TP_STREAM=0 xl26 8 2 0 20 tp=2,@XL26"
# where @XL26 / @D5120 in EXTRA expand to the model shapes below. Each run
# prints its tokens/s, step ms, exposed comm, MFU, memory and pipeline bubble.
# Suites:
#   gpt2-1558m-layouts  GPT-2 1558M on 1 GPU, tp2, pp2 (8 micro-batches), dp2
#                       ZeRO-1 at pp2's global batch
#   pp-split            1558M pp2 with the even and the balanced block split
#   zero3-1558m         1558M on 1 GPU and dp2 ZeRO-3
#   tp-xl26             a GPT-2 XL-sized model whose heads split over 2 GPUs
#                       (48 layers, d 1664, 26 heads of 64: 1.68B), 1 GPU, tp2
#   tp-stream           tp2 on it with the all-reduce on the compute stream and
#                       through the comm thread (LOOM_TP_STREAM=0), and 1 GPU
#   zero3-13b           13.5B (42 layers of d 5120) dp2 ZeRO-3, no offload
#   offload-13b         13.5B dp2 ZeRO-3 + optimizer offload (BIGSTEPS, 6;
#                       BIGT, the timeout, 330 s); samples memory
#   offload-layers      the same with BIGL layers of d 5120 (default 50:
#                       16.0B); samples memory
# SAMPLE_MEM=1 samples GPU memory (nvidia-smi, 0.5 s) and host memory (1 s)
# during every run and prints the maxima.
. "$(dirname "$0")/env.sh"
XL26=n_layer=48,n_head=26,d_model=1664,d_ff=6656
D5120=n_head=40,d_model=5120,d_ff=20480
BIGRUN=recompute=full,nosave=1,accum=2
suite() {
    case $1 in
    gpt2-1558m-layouts) printf '%s\n' "1558m 8 1 0 20" "1558m 8 2 0 20 tp=2" \
        "1558m 8 2 0 12 pp=2,accum=8" "1558m 8 2 1 12 accum=4" ;;
    pp-split) printf '%s\n' "1558m 8 2 0 12 pp=2,accum=8" "1558m 8 2 0 12 pp=2,accum=8,pp_balance=1" ;;
    zero3-1558m) printf '%s\n' "1558m 8 1 0 12" "1558m 8 2 3 16" "1558m 8 1 0 12" ;;
    tp-xl26) printf '%s\n' "xl26 8 1 0 20 @XL26" "xl26 8 2 0 20 tp=2,@XL26" ;;
    tp-stream) printf '%s\n' "xl26 8 2 0 20 tp=2,@XL26" "LOOM_TP_STREAM=0 xl26 8 2 0 20 tp=2,@XL26" \
        "xl26 8 1 0 20 @XL26" ;;
    zero3-13b) echo "OMP_NUM_THREADS=16 13b 4 2 3 6 n_layer=42,@D5120,$BIGRUN,timeout=300" ;;
    offload-13b)
        SAMPLE_MEM=1 TIMEOUT=${BIGT:-330}
        echo "OMP_NUM_THREADS=16 13b 4 2 3 ${BIGSTEPS:-6} n_layer=42,@D5120,offload=1,$BIGRUN,timeout=320"
        ;;
    offload-layers)
        SAMPLE_MEM=1 TIMEOUT=330
        echo "OMP_NUM_THREADS=16 big 4 2 3 6 n_layer=${BIGL:-50},@D5120,offload=1,$BIGRUN,timeout=320"
        ;;
    *) return 1 ;;
    esac
}
fields='"nproc": [0-9]*\|"extra": "[^"]*"\|"tokens_per_s": [0-9.]*\|"step_ms": [0-9.]*\|"comm_exposed_ms": [0-9.]*\|"mfu": [0-9.]*\|"mem_gib": [0-9.]*\|"bubble_frac": \[[^]]*\]'
one() { # "[VAR=VAL ...] MODEL MBS NPROC ZERO STEPS [EXTRA]"
    local words vars=""
    read -ra words <<<"$1"
    while [ ${#words[@]} -gt 0 ] && [[ ${words[0]} =~ ^[A-Z_][A-Z0-9_]*= ]]; do
        vars="$vars${vars:+,}${words[0]}"
        words=("${words[@]:1}")
    done
    local extra=${words[5]:-}
    extra=${extra//@XL26/$XL26}
    extra=${extra//@D5120/$D5120}
    local smi="" hm=""
    if [ "${SAMPLE_MEM:-0}" = 1 ]; then
        nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 \
            >"$OUT/gpumem.csv" 2>/dev/null &
        smi=$!
        (while sleep 1; do
            awk '/MemTotal/{t=$2}/MemAvailable/{a=$2}END{print (t-a)/1048576}' /proc/meminfo
        done) >"$OUT/hostmem.txt" &
        hm=$!
    fi
    echo "run: ${vars:+$vars }${words[*]:0:5} $extra"
    with_vars "$vars" timeout "${TIMEOUT:-300}" python3 tests/gpu/dist_check.py bench "$BIN" \
        "$OUT/dist" "${words[@]:0:5}" "$extra" >"$OUT/run.txt" 2>&1
    echo "rc=$? $(grep -o "$fields" "$OUT/run.txt" | tr '\n' ' ')"
    grep -v '^RESULT' "$OUT/run.txt" | cut -c1-1500 | head -20
    if [ -n "$smi" ]; then
        kill "$smi" "$hm" 2>/dev/null
        echo "gpu MiB max per index:"
        awk -F', ' '{if($2>m[$1])m[$1]=$2}END{for(i in m)print i, m[i]}' "$OUT/gpumem.csv"
        echo "gpu MiB during steps (last 20 samples, gpu 0): $(awk -F', ' '$1==0{print $2}' \
            "$OUT/gpumem.csv" | tail -24 | head -20 | tr '\n' ' ')"
        echo "host GiB used max: $(sort -n "$OUT/hostmem.txt" | tail -1) of" \
            "$(awk '/MemTotal/{print $2/1048576}' /proc/meminfo)"
        grep -h '"type":"step"' "$OUT"/dist/bench_"${words[0]}"_*.out 2>/dev/null | cut -c1-400 | tail -4
        grep -h "error\|Error\|FAIL" "$OUT"/dist/bench_"${words[0]}"_*.err 2>/dev/null | head -5
    fi
    el
}
[ $# -eq 0 ] && set -- gpt2-1558m-layouts
for a in "$@"; do
    if runs=$(suite "$a"); then
        # in a subshell: the suite's SAMPLE_MEM / TIMEOUT hold for its runs only
        (
            suite "$a" >/dev/null
            while IFS= read -r r; do one "$r"; done <<<"$runs"
        )
    else
        one "$a"
    fi
done
