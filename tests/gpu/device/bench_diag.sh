#!/bin/bash
# What diagnosis sampling costs a cuda training run: loom-worker on one GPU
# (GPT-2 124M by default, micro-batch 16, T 1024, --rank-steps as loom-agent
# starts it) with LOOM_DIAG=1 and LOOM_DIAG=0, interleaved on/off, off/on, ...
# (tests/bench/bench_diag.py worker; each run's median step after 10 warm-up
# steps). Where the machine has two GPUs or more, the same for dp2 (two
# ranks: the timing sync before grad_sync and rank 1's rank_step lines are
# what diag 0 leaves out). One RESULT line per layout:
#   RESULT {"bench":"diag","gpus":N,"ratio_on_off":..,"diff_pct":..,"ci95_pct":[..],...}
# Env: DIAG_PRESET (124m), DIAG_MBS (16), DIAG_STEPS (150), DIAG_PAIRS (3),
# CUDNN=1 (env.sh). Logs and the per-run JSON under $OUT.
. "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
layouts=(1)
[ "${ngpu:-0}" -ge 2 ] && layouts+=(2)
for np in "${layouts[@]}"; do
    log=$OUT/diag_${np}gpu
    timeout 280 python3 tests/bench/bench_diag.py worker "$BIN" --device cuda --nproc "$np" \
        --preset "${DIAG_PRESET:-124m}" --mbs "${DIAG_MBS:-16}" --steps "${DIAG_STEPS:-150}" \
        --pairs "${DIAG_PAIRS:-3}" --warmup 10 --json "$log.json" >"$log.log" 2>&1
    echo "diag ${np} gpu rc=$? $(el)"
    grep -E '^(run|diag|on /|FAIL)' "$log.log" | tail -12
    grep '^RESULT ' "$log.log" | sed 's/^RESULT //' | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
print("RESULT " + json.dumps({"bench": "diag", "gpus": int(sys.argv[1]),
      "ratio_on_off": s["on_median_ms"] / s["off_median_ms"], "diff_pct": s["diff_pct"],
      "paired_mean_pct": s["paired_mean_pct"], "ci95_pct": s["ci95_pct"],
      "off_spread_pct": s["off_spread_pct"], "on_median_ms": s["on_median_ms"],
      "off_median_ms": s["off_median_ms"], "pairs": s["pairs"], "verdict": s["verdict"]}))
' "$np" || echo "RESULT {\"bench\":\"diag\",\"gpus\":$np,\"error\":\"no result (see $log.log)\"}"
done
