#!/bin/bash
# Device call: optimizer offload on the GPUs: test_gpu_train (offload vs
# on-device, async vs sync copies), dp2 curves with offload and ZeRO 1-3,
# then the largest GPT-style model with ZeRO-3 + offload (13.5B, T 1024),
# sampling GPU and host memory while it runs.
. "$(dirname "$0")/call_env.sh"
s=""
timeout 120 "$BIN/test_gpu_kernels" >"$OUT/kernels.log" 2>&1; r=$?
grep -E "^FAIL|checks passed" "$OUT/kernels.log" | head -5; s="$s kernels=$r"
timeout 200 "$BIN/test_gpu_train" >"$OUT/train.log" 2>&1; r=$?
grep -E "^FAIL|offload|passed|FAILED" "$OUT/train.log" | head -20; s="$s train=$r"
el
timeout 200 python3 tests/gpu/dist_check.py curves "$BIN" "$OUT/dist" \
    "dp=2,zero_stage=1;dp=2,zero_stage=2;dp=2,zero_stage=3;dp=2,zero_stage=3,offload=1;dp=2,zero_stage=1,offload=1"; s="$s curves=$?"
el
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 >"$OUT/gpumem.csv" 2>/dev/null &
smi=$!
( while sleep 1; do awk '/MemTotal/{t=$2}/MemAvailable/{a=$2}END{print (t-a)/1048576}' /proc/meminfo; done ) >"$OUT/hostmem.txt" &
hm=$!
OMP_NUM_THREADS=16 timeout ${BIGT:-330} python3 tests/gpu/dist_check.py bench "$BIN" "$OUT/dist" 13b 4 2 3 ${BIGSTEPS:-6} \
    n_layer=42,n_head=40,d_model=5120,d_ff=20480,offload=1,recompute=full,nosave=1,accum=2,timeout=320 \
    >"$OUT/big.txt" 2>&1; s="$s big=$?"
kill $smi $hm 2>/dev/null
cat "$OUT/big.txt" | cut -c1-3000
echo "gpu MiB max per index:"; awk -F', ' '{if($2>m[$1])m[$1]=$2}END{for(i in m)print i, m[i]}' "$OUT/gpumem.csv"
echo "host GiB used max: $(sort -n "$OUT/hostmem.txt" | tail -1)"
grep -h '"type":"step"' "$OUT"/dist/bench_13b*.out 2>/dev/null | cut -c1-400 | tail -4
grep -h "error\|Error\|FAIL" "$OUT"/dist/bench_13b*.err 2>/dev/null | head -5
tail -3 "$OUT"/dist/bench_13b*.err 2>/dev/null
el
echo "SUMMARY:$s"
