#!/bin/sh
# Loom quick start: the README's main command. On a fresh Debian 12 / Ubuntu
# machine it installs the build dependencies, builds Loom, starts a one-node
# cluster (loomd + one loom-agent, on the GPUs when a GPU and a CUDA build are
# present, else on CPU devices), prepares a byte-level corpus (Debian's licence
# texts; on a GPU also every /usr/share/doc/*/copyright file), creates a tenant,
# submits a small GPT-2-style job with loomctl, prints the loss as it trains and
# a text plot of it at the end, exports the model and prints where the
# checkpoint, the exported model, the tokens and the URL are.
#
# Usage: deploy/quickstart.sh          run (refuses while a cluster from the
#                                      same directory is still running)
#        deploy/quickstart.sh stop     stop a cluster left running by
#                                      LOOM_QUICKSTART_KEEP=1 (by its pid files)
#
# Environment: LOOM_QUICKSTART_DIR (default ./loom-quickstart), LOOM_QUICKSTART_STEPS
# (default 40 on CPU, 1000 on GPU), LOOM_QUICKSTART_KEEP=1 leaves the cluster running,
# LOOM_QUICKSTART_MODEL=tiny trains a 2-layer 64-wide model (for tests),
# LOOM_QUICKSTART_BIN=DIR uses the binaries in DIR and skips set-up and build.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)
QS=${LOOM_QUICKSTART_DIR:-$ROOT/loom-quickstart}
ME="deploy/quickstart.sh"
[ -n "${LOOM_QUICKSTART_DIR:-}" ] && ME="LOOM_QUICKSTART_DIR=$QS $ME"

# pid_alive FILE NAME: the pid in FILE is a live process whose command line
# names NAME (a recycled pid of another program does not count).
pid_alive() {
    [ -s "$1" ] || return 1
    p=$(cat "$1")
    kill -0 "$p" 2>/dev/null || return 1
    if [ -r "/proc/$p/cmdline" ]; then
        tr '\0' ' ' <"/proc/$p/cmdline" | grep -q "$2" || return 1
    fi
    return 0
}

# The live processes of a cluster started from $QS, as "NAME pid PID" words.
running() {
    out=""
    for n in loom-agent loomd; do
        pid_alive "$QS/$n.pid" "$n" && out="$out $n pid $(cat "$QS/$n.pid")"
    done
    echo "$out"
}

stop_cluster() {
    for n in loom-agent loomd; do
        f="$QS/$n.pid"
        if pid_alive "$f" "$n"; then
            p=$(cat "$f")
            kill "$p" 2>/dev/null || true
            i=0
            while kill -0 "$p" 2>/dev/null && [ $i -lt 100 ]; do
                i=$((i + 1))
                sleep 0.1
            done
            kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null || true
            echo "stopped $n (pid $p)"
        fi
        rm -f "$f"
    done
}

case "${1:-}" in
stop)
    if [ -z "$(running)" ]; then
        echo "no quick-start cluster is running from $QS"
        rm -f "$QS/loomd.pid" "$QS/loom-agent.pid"
        exit 0
    fi
    stop_cluster
    exit 0
    ;;
"") ;;
-h | --help)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
*)
    echo "usage: deploy/quickstart.sh [stop]" >&2
    exit 2
    ;;
esac

live=$(running)
if [ -n "$live" ]; then
    echo "quickstart: a cluster started from $QS is still running ($live)." >&2
    echo "quickstart: not wiping $QS; stop it first with: $ME stop" >&2
    exit 1
fi

if [ -n "${LOOM_QUICKSTART_BIN:-}" ]; then
    BIN=$(cd "$LOOM_QUICKSTART_BIN" && pwd)
else
    ./tools/setup.sh
    jobs=$(nproc 2>/dev/null || echo 2)
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build build -j "$jobs"
    BIN=$ROOT/build/bin
fi

rm -rf "$QS"
mkdir -p "$QS"
QS=$(cd "$QS" && pwd)

pids=""
cleanup() {
    if [ "${LOOM_QUICKSTART_KEEP:-0}" != 1 ]; then
        for p in $pids; do kill "$p" 2>/dev/null || true; done
        for p in $pids; do wait "$p" 2>/dev/null || true; done
        rm -f "$QS/loomd.pid" "$QS/loom-agent.pid"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

device=cpu
agent_devices="--cpu-devices 1"
# GPU when the driver sees one and this build has the CUDA backend (nvcc was
# found at configure time: the GPU-only bench binary is built only then).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
    [ -x "$BIN/loom-gpu-bench" ]; then
    device=cuda
    agent_devices=""
fi

echo "== preparing the corpus (byte-level tokens)"
mkdir -p "$QS/corpus"
cp -L /usr/share/common-licenses/* "$QS/corpus/"
if [ "$device" = cuda ]; then
    # A GPU trains a model that would learn the 0.26 MB of licence texts by
    # heart within a minute; the packages' copyright files (some 20 MB on a
    # desktop install) give it enough text for a validation loss that means
    # something.
    find /usr/share/doc -name copyright -type f -exec cat {} + >"$QS/corpus/copyright.txt" \
        2>/dev/null || true
fi
"$BIN/loom-data" prepare --in "$QS/corpus" --out "$QS/data" >"$QS/prepare.json"

rand() { od -An -tx1 -N24 /dev/urandom | tr -d ' \n'; }
# Secrets live in files only the user can read (mode 0600).
secret() { (umask 077 && printf '%s\n' "$2" >"$1"); }
LOOM_ADMIN_TOKEN=$(rand)
LOOM_JOIN_TOKEN=$(rand)
secret "$QS/admin.token" "$LOOM_ADMIN_TOKEN"
secret "$QS/join.token" "$LOOM_JOIN_TOKEN"
export LOOM_ADMIN_TOKEN LOOM_JOIN_TOKEN

echo "== starting loomd (log: $QS/loomd.log)"
"$BIN/loomd" --auto-approve --listen 127.0.0.1:0 --data-dir "$QS/loomd" --data-roots "$QS/data" \
    >"$QS/loomd.log" 2>&1 &
pids="$! $pids"
echo $! >"$QS/loomd.pid"
i=0
while [ ! -s "$QS/loomd/loomd.addr" ]; do
    i=$((i + 1))
    [ $i -gt 100 ] && { echo "loomd did not start; see $QS/loomd.log"; exit 1; }
    sleep 0.1
done
LOOM_URL=$(cat "$QS/loomd/loomd.addr")
export LOOM_URL
printf '%s\n' "$LOOM_URL" >"$QS/url"

echo "== starting loom-agent on $device (log: $QS/agent.log)"
# shellcheck disable=SC2086
"$BIN/loom-agent" --coordinator "$LOOM_URL" --name node-0 --work-dir "$QS/agent" \
    $agent_devices >"$QS/agent.log" 2>&1 &
pids="$! $pids"
echo $! >"$QS/loom-agent.pid"

echo "== creating a tenant and its token"
LOOM_TOKEN=$LOOM_ADMIN_TOKEN "$BIN/loomctl" --json tenant-create quickstart \
    --data-root "$QS/data" >"$QS/tenant.json"
tenant=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$QS/tenant.json")
tok=$(LOOM_TOKEN=$LOOM_ADMIN_TOKEN "$BIN/loomctl" --json token-create "$tenant" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
secret "$QS/tenant.token" "$tok"
LOOM_TOKEN=$tok
export LOOM_TOKEN

steps=${LOOM_QUICKSTART_STEPS:-40}
precision=fp32 mbs=8 layers=4 dmodel=128 heads=4 seq=128 lr=3e-3 minlr=3e-4 warmup=5
if [ "$device" = cuda ]; then
    # About 25M parameters, 16k tokens a step: 1000 steps read most of the
    # corpus once (no epoch of repeats), in a few minutes on one GPU. A lower
    # peak rate and a longer warm-up than the small CPU model's keep bf16
    # training of the wider model stable.
    steps=${LOOM_QUICKSTART_STEPS:-1000}
    precision=bf16 mbs=32 layers=8 dmodel=512 heads=8 seq=512 lr=1e-3 minlr=1e-4 warmup=50
fi
[ "$warmup" -lt "$steps" ] || warmup=$((steps / 10))
if [ "${LOOM_QUICKSTART_MODEL:-}" = tiny ]; then
    mbs=4 layers=2 dmodel=64 heads=4 seq=64
fi
every=$((steps / 2))
[ "$every" -ge 1 ] || every=1
[ "$device" = cuda ] && every=$((steps / 10 > 0 ? steps / 10 : 1))
cat >"$QS/job.json" <<JSON
{
  "name": "quickstart-gpt",
  "labels": {"example": "quickstart"},
  "model": {"family": "gpt2", "n_layer": $layers, "n_head": $heads, "d_model": $dmodel,
            "vocab_size": 256, "seq_len": $seq},
  "data": {"train": "$QS/data/train_*.bin", "val": "$QS/data/val_*.bin"},
  "parallel": {"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0},
  "train": {"steps": $steps, "micro_batch": $mbs, "lr": $lr, "min_lr": $minlr,
            "warmup_steps": $warmup, "schedule": "cosine", "precision": "$precision",
            "eval_every": $every, "eval_batches": 8},
  "checkpoint": {"every_steps": $every, "keep": 2},
  "export": {"hf": true},
  "resources": {"device": "$device", "gpus_per_node": 1},
  "max_retries": 2
}
JSON
echo "== submitting $QS/job.json"
"$BIN/loomctl" --json submit "$QS/job.json" >"$QS/submitted.json"
job=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$QS/submitted.json")
echo "   job $job"

# progress.py METRICS.json STEPS [plot]: prints the step and evaluation
# records newer than the last call (state in $QS/.printed), about 20 lines
# over the run; with "plot", a text plot of the whole loss curve.
cat >"$QS/progress.py" <<'PY'
import json, math, os, sys
m = json.load(open(sys.argv[1]))
total = int(sys.argv[2])
series = m.get("series") or []
evals = {e["step"]: e["val_loss"] for e in m.get("evals") or [] if "val_loss" in e}
if len(sys.argv) > 3:
    pts = [(s["step"], s["loss"]) for s in series if isinstance(s.get("loss"), (int, float))]
    if len(pts) < 2:
        sys.exit(0)
    W, H = min(60, len(pts)), 12
    cols = [[] for _ in range(W)]
    for st, l in pts:
        cols[min(W - 1, (st - pts[0][0]) * W // (pts[-1][0] - pts[0][0] + 1))].append(l)
    ys = [sum(c) / len(c) if c else None for c in cols]
    lo, hi = min(y for y in ys if y is not None), max(y for y in ys if y is not None)
    hi = hi if hi > lo else lo + 1e-9
    print("   training loss (mean per column), step %d..%d" % (pts[0][0], pts[-1][0]))
    for r in range(H):
        level = hi - (hi - lo) * r / (H - 1)
        row = "".join("*" if y is not None and abs(y - level) <= (hi - lo) / (2 * (H - 1)) + 1e-12
                      else " " for y in ys)
        print("   %7.3f |%s" % (level, row))
    print("           +" + "-" * W)
    if evals:
        print("   validation loss: " + ", ".join("step %d %.3f" % (k, evals[k]) for k in sorted(evals)))
    sys.exit(0)
state = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), ".printed")
last = int(open(state).read() or 0) if os.path.exists(state) else 0
every = max(1, total // 20)
for s in series:
    st = s.get("step", 0)
    if st <= last:
        continue
    if st % every == 0 or st == total or st in evals or st == 1:
        line = "   step %d/%d loss %.4f" % (st, total, s.get("loss", float("nan")))
        if st in evals:
            line += " val %.4f" % evals[st]
        tps = s.get("tokens_per_s")
        if isinstance(tps, (int, float)):
            line += " %.0f tok/s" % tps
        print(line, flush=True)
    last = st
open(state, "w").write(str(last))
PY

echo "== following $job (loss every ~$((steps / 20 > 0 ? steps / 20 : 1)) steps)"
last=""
while :; do
    "$BIN/loomctl" --json get "$job" >"$QS/job-state.json"
    state=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["state"])' "$QS/job-state.json")
    if [ "$state" != "$last" ]; then
        echo "   state: $state"
        last=$state
    fi
    if "$BIN/loomctl" --json metrics "$job" >"$QS/metrics.json" 2>/dev/null; then
        python3 "$QS/progress.py" "$QS/metrics.json" "$steps" || true
    fi
    case "$state" in succeeded | failed | cancelled) break ;; esac
    sleep 1
done
python3 "$QS/progress.py" "$QS/metrics.json" "$steps" plot || true
"$BIN/loomctl" events "$job" || true
if [ "$state" != succeeded ]; then
    echo "job $job ended $state; logs: $QS/agent/ and 'loomctl logs $job'"
    exit 1
fi

out=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j.get("out_dir") or "")' "$QS/job-state.json")
[ -n "$out" ] || out="$QS/loomd/jobs/$job"
ckpt=$(ls -d "$out"/checkpoints/step_* 2>/dev/null | tail -n 1)
echo "== exporting the trained model (Hugging Face safetensors names)"
"$BIN/loom-worker" --spec "$QS/job.json" --device "$device" --out "$out" --export "$QS/model.safetensors" \
    >"$QS/export.log" 2>&1 || { echo "export failed; see $QS/export.log"; exit 1; }

echo
echo "Done: job $job succeeded."
echo "  checkpoint:      $ckpt"
echo "  exported model:  $QS/model.safetensors"
echo "  job spec:        $QS/job.json"
echo "  loomd:           $LOOM_URL"
echo "  admin token:     $QS/admin.token (mode 0600)"
echo "  tenant token:    $QS/tenant.token (mode 0600)"
if [ "${LOOM_QUICKSTART_KEEP:-0}" = 1 ]; then
    echo
    echo "The cluster keeps running (loomd pid $(cat "$QS/loomd.pid"), loom-agent pid $(cat "$QS/loom-agent.pid")). Paste:"
    echo "  export LOOM_URL=$LOOM_URL"
    echo "  export LOOM_TOKEN=\$(cat $QS/tenant.token)"
    echo "  export PATH=$BIN:\$PATH"
    echo "then 'loomctl get $job', 'loomctl logs $job', the web view at $LOOM_URL/ui;"
    echo "the job's own export (export.hf): 'loomctl artifacts $job', then"
    echo "  loomctl download $job export/hf/model.safetensors -o model.safetensors"
    echo "why a job failed: 'loomctl get JOB' (reason) and 'loomctl events JOB';"
    echo "admin commands with LOOM_TOKEN=\$(cat $QS/admin.token). Stop it with: $ME stop"
else
    echo "  (the cluster was stopped; LOOM_QUICKSTART_KEEP=1 leaves it running)"
fi
