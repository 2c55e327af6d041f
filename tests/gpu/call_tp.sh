#!/bin/bash
# Device call: tp2 on a GPT-2 XL-sized model whose heads split over 2 GPUs
# (48 layers, d 1664, 26 heads of 64: 1.68B; GPT-2 XL's 25 heads do not
# divide by 2), beside the same model on one GPU; then the largest ZeRO-3 +
# offload model the host memory allows (BIGL layers of d 5120).
. "$(dirname "$0")/call_env.sh"
X=n_layer=48,n_head=26,d_model=1664,d_ff=6656
d() { timeout 200 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" xl26 "$@" | cut -c1-1200; el; }
d 8 1 0 20 $X
d 8 2 0 20 tp=2,$X
if [ "${BIGL:-0}" -gt 0 ]; then
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 >"$OUT/gpumem.csv" 2>/dev/null &
    smi=$!
    ( while sleep 1; do awk '/MemTotal/{t=$2}/MemAvailable/{a=$2}END{print (t-a)/1048576}' /proc/meminfo; done ) >"$OUT/hostmem.txt" &
    hm=$!
    OMP_NUM_THREADS=16 timeout 330 python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" big 4 2 3 6 \
        n_layer=$BIGL,n_head=40,d_model=5120,d_ff=20480,offload=1,recompute=full,nosave=1,accum=2,timeout=320 \
        2>&1 | cut -c1-2500
    kill $smi $hm 2>/dev/null
    echo "gpu MiB max per index:"; awk -F', ' '{if($2>m[$1])m[$1]=$2}END{for(i in m)print i, m[i]}' "$OUT/gpumem.csv"
    echo "gpu MiB during steps (last 20 samples, gpu 0): $(awk -F', ' '$1==0{print $2}' "$OUT/gpumem.csv" | tail -24 | head -20 | tr '\n' ' ')"
    echo "host GiB used max: $(sort -n "$OUT/hostmem.txt" | tail -1) of $(awk '/MemTotal/{print $2/1048576}' /proc/meminfo)"
    grep -h "error\|rror:" "$OUT"/dist/bench_big*.err 2>/dev/null | head -5
    el
fi
