#!/bin/bash
# What diagnosis sampling costs a cuda training run: loom-worker on one GPU
# (GPT-2 124M by default, micro-batch 16, T 1024, --rank-steps as loom-agent
# starts it) with LOOM_DIAG=1 and LOOM_DIAG=0 (tests/bench/bench_diag.py
# worker), two ways:
#   runs    whole runs interleaved on/off, off/on, ... (DIAG_PAIRS pairs of
#           DIAG_STEPS steps; each run's median step after 10 warm-up steps)
#   blocks  one run alternating on and off every DIAG_AB steps (the worker's
#           debug row diag-ab; each off block against its two on neighbours)
# Where the machine has two GPUs or more, the same for dp2 (two ranks: the
# timing sync before grad_sync and rank 1's rank_step lines are what diag 0
# leaves out; on one GPU there is no gradient synchronisation to split, so
# the ratio shows the noise). One RESULT line per layout:
#   RESULT {"bench":"diag","gpus":N,"ratio_on_off":..,"diff_pct":..,"ci95_pct":[..],
#           "blocks_median_pct":..,"blocks_median_ci95_pct":[..],
#           "control_aa_median_pct":..,...}
# (blocks also with as many A/A blocks, sampling off throughout: --control)
# Env: DIAG_PRESET (124m), DIAG_MBS (16), DIAG_STEPS (120), DIAG_PAIRS (3),
# DIAG_AB (10), DIAG_AB_STEPS (300), CUDNN=1 (env.sh). Logs and the per-run
# JSON under $OUT.
. "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
layouts=(1)
[ "${ngpu:-0}" -ge 2 ] && layouts+=(2)
common=(--device cuda --preset "${DIAG_PRESET:-124m}" --mbs "${DIAG_MBS:-16}" --warmup 10)
for np in "${layouts[@]}"; do
    log=$OUT/diag_${np}gpu
    timeout 200 python3 tests/bench/bench_diag.py worker "$BIN" "${common[@]}" --nproc "$np" \
        --steps "${DIAG_STEPS:-120}" --pairs "${DIAG_PAIRS:-3}" --json "$log.runs.json" \
        >"$log.runs.log" 2>&1
    echo "diag ${np} gpu runs rc=$? $(el)"
    grep -E '^(run|diag|on /|FAIL)' "$log.runs.log" | tail -12
    timeout 150 python3 tests/bench/bench_diag.py worker "$BIN" "${common[@]}" --nproc "$np" \
        --steps "${DIAG_AB_STEPS:-300}" --pairs 1 --ab "${DIAG_AB:-10}" --control \
        --json "$log.blocks.json" >"$log.blocks.log" 2>&1
    echo "diag ${np} gpu blocks rc=$? $(el)"
    grep -E '^(run|diag|on /|FAIL)' "$log.blocks.log" | tail -5
    python3 - "$np" "$log.runs.json" "$log.blocks.json" <<'EOF'
import json, sys
np, runs, blocks = int(sys.argv[1]), sys.argv[2], sys.argv[3]
r = {"bench": "diag", "gpus": np}
try:
    s = json.load(open(runs))["summary"]
    r.update({"ratio_on_off": s["on_median_ms"] / s["off_median_ms"], "diff_pct": s["diff_pct"],
              "paired_mean_pct": s["paired_mean_pct"], "ci95_pct": s["ci95_pct"],
              "paired_median_pct": s["paired_median_pct"],
              "median_ci95_pct": s["median_ci95_pct"],
              "off_spread_pct": s["off_spread_pct"], "on_median_ms": s["on_median_ms"],
              "off_median_ms": s["off_median_ms"], "pairs": s["pairs"], "verdict": s["verdict"]})
except (OSError, ValueError, KeyError) as e:
    r["runs_error"] = "no result: %s" % e
try:
    b = json.load(open(blocks))["summary"]
    r.update({"blocks": b["blocks"], "blocks_diff_pct": b["paired_mean_pct"],
              "blocks_ci95_pct": b["ci95_pct"], "blocks_median_pct": b["paired_median_pct"],
              "blocks_median_ci95_pct": b["median_ci95_pct"], "blocks_verdict": b["verdict"]})
    if "control" in b:
        r["control_aa_median_pct"] = b["control"]["paired_median_pct"]
        r["control_aa_median_ci95_pct"] = b["control"]["median_ci95_pct"]
except (OSError, ValueError, KeyError) as e:
    r["blocks_error"] = "no result: %s" % e
print("RESULT " + json.dumps(r))
EOF
done
