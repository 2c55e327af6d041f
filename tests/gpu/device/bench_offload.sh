#!/bin/bash
# Optimizer offload on one GPU (worker/offload.h, docs/engine.md "Optimizer
# offload"): the CPU AdamW's kernels checked on this machine's CPU (AVX-512
# where it has it), their bandwidth beside memcpy, then the Llama 3 8B shape
# (T 2048, micro-batch 2, selective recompute, 8 micro-steps of accumulation)
# through loom-gpu-bench without offload, with it (the chunked pipeline) and
# with the one-step delayed update; last, the ratio of each offload run to the
# run without.
# Usage: tests/gpu/device/bench_offload.sh   (BUILD: the carried build folder)
# Lines: PASS/FAIL of the kernel checks, one RESULT line per run, logs under $OUT.
. "$(dirname "$0")/env.sh"
timeout 120 "$BIN/test_offload_adamw" >"$OUT/offload_adamw.log" 2>&1
echo "test_offload_adamw rc=$? $(el)"
grep -E "^(PASS|FAIL)|best isa|not on this CPU" "$OUT/offload_adamw.log"
timeout 120 /usr/bin/python3 tests/unit/test_offload_adamw_ref.py "$BIN/test_offload_adamw" \
    2>&1 | grep -E "^(PASS|FAIL)"
nproc_=$(nproc)
timeout 200 "$BIN/bench_offload_adamw" 4 1 $((nproc_ / 2)) "$nproc_" >"$OUT/bench_offload_adamw.out" \
    2>"$OUT/bench_offload_adamw.err"
echo "bench_offload_adamw rc=$? $(el)"
grep '^RESULT' "$OUT/bench_offload_adamw.out"
free -g | head -2
SHAPE=${SHAPE:---family llama --model 8b --mbs 2 --T 2048 --recompute selective --accum 8}
STEPS=${OSTEPS:-4}
run() { # TAG ARGS...: one loom-gpu-bench run, its RESULT line tagged
    local tag=$1
    shift
    # shellcheck disable=SC2086
    timeout "${OTIMEOUT:-330}" "$BIN/loom-gpu-bench" $SHAPE --steps "$STEPS" --warmup 2 --profile 0 \
        "$@" >"$OUT/offload_$tag.out" 2>"$OUT/offload_$tag.err"
    local rc=$?
    echo "loom-gpu-bench $tag rc=$rc $(el)"
    grep -h "offload:" "$OUT/offload_$tag.err" | head -3
    sed -n "s/^RESULT {/RESULT {\"run\":\"$tag\",/p" "$OUT/offload_$tag.out" | tee -a "$OUT/offload_results.txt"
    [ "$rc" = 0 ] || tail -5 "$OUT/offload_$tag.err"
}
: >"$OUT/offload_results.txt"
run none
run on --offload on
run delayed --offload delayed --offload-threads $((nproc_ - 1))
# start-up with the one-call cudaHostAlloc (before) beside the registered pieces above, and
# the shape of the first measurement (full recompute, mbs 1, no accumulation: 378 tokens/s)
STEPS=1 run on-alloc --offload on --offload-pin alloc --warmup 0
SHAPE="--family llama --model 8b --mbs 1 --T 2048 --recompute full" run on-mbs1 --offload on
python3 - "$OUT/offload_results.txt" <<'PY'
import json, sys
rs = {}
for l in open(sys.argv[1]):
    r = json.loads(l[len("RESULT "):])
    rs[r["run"]] = r
base = rs.get("none", {}).get("tokens_per_s")
for tag in ("on", "delayed"):
    r = rs.get(tag)
    if not r or not base:
        print("RESULT " + json.dumps({"bench": "offload_ratio", "run": tag, "missing": True}))
        continue
    print("RESULT " + json.dumps({
        "bench": "offload_ratio", "run": tag, "tokens_per_s": r["tokens_per_s"],
        "no_offload_tokens_per_s": base, "ratio": round(r["tokens_per_s"] / base, 3),
        "step_ms": r["step_ms_median"], "compute_ms": r.get("compute_ms"),
        "optimizer_ms": r.get("optimizer_ms"), "cpu_adamw_ms": r.get("cpu_adamw_ms"),
        "copy_wait_ms": r.get("copy_wait_ms"), "cpu_wait_ms": r.get("cpu_wait_ms"),
        "startup_s": r.get("startup_s"), "host_state_s": r.get("host_state_s"),
        "pin_s": r.get("pin_s"), "goal_0_6": r["tokens_per_s"] / base >= 0.6}))
PY
echo "done $(el)"
