#!/bin/sh
# Loom quick start: the README's main command. On a fresh Debian 12 / Ubuntu
# machine it installs the build dependencies, builds Loom, starts a one-node
# cluster (loomd + one loom-agent, on the GPUs when a GPU and a CUDA build are
# present, else on CPU devices), prepares a small byte-level corpus from
# Debian's licence texts (/usr/share/common-licenses), creates a tenant, submits
# a small GPT-2-style job with loomctl, follows it to the end, exports the model
# and prints where the checkpoint and the exported model are.
#
# Environment: LOOM_QUICKSTART_DIR (default ./loom-quickstart), LOOM_QUICKSTART_STEPS
# (default 40 on CPU, 300 on GPU), LOOM_QUICKSTART_KEEP=1 leaves the cluster running.
set -eu
cd "$(dirname "$0")/.."
ROOT=$(pwd)

./tools/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$jobs"
BIN=$ROOT/build/bin

QS=${LOOM_QUICKSTART_DIR:-$ROOT/loom-quickstart}
rm -rf "$QS"
mkdir -p "$QS"
QS=$(cd "$QS" && pwd)

pids=""
cleanup() {
    if [ "${LOOM_QUICKSTART_KEEP:-0}" != 1 ]; then
        for p in $pids; do kill "$p" 2>/dev/null || true; done
        for p in $pids; do wait "$p" 2>/dev/null || true; done
    fi
}
trap cleanup EXIT INT TERM

echo "== preparing the corpus (Debian licence texts, byte-level tokens)"
"$BIN/loom-data" prepare --in /usr/share/common-licenses --out "$QS/data" >"$QS/prepare.json"

rand() { od -An -tx1 -N24 /dev/urandom | tr -d ' \n'; }
LOOM_ADMIN_TOKEN=$(rand)
LOOM_JOIN_TOKEN=$(rand)
export LOOM_ADMIN_TOKEN LOOM_JOIN_TOKEN

echo "== starting loomd (log: $QS/loomd.log)"
"$BIN/loomd" --listen 127.0.0.1:0 --data-dir "$QS/loomd" --data-roots "$QS/data" \
    >"$QS/loomd.log" 2>&1 &
pids="$! $pids"
i=0
while [ ! -s "$QS/loomd/loomd.addr" ]; do
    i=$((i + 1))
    [ $i -gt 100 ] && { echo "loomd did not start; see $QS/loomd.log"; exit 1; }
    sleep 0.1
done
LOOM_URL=$(cat "$QS/loomd/loomd.addr")
export LOOM_URL

device=cpu
agent_devices="--cpu-devices 1"
# GPU when the driver sees one and this build has the CUDA backend (nvcc was
# found at configure time: the GPU-only bench binary is built only then).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
    [ -x "$BIN/loom-gpu-bench" ]; then
    device=cuda
    agent_devices=""
fi
echo "== starting loom-agent on $device (log: $QS/agent.log)"
# shellcheck disable=SC2086
"$BIN/loom-agent" --coordinator "$LOOM_URL" --name node-0 --work-dir "$QS/agent" \
    $agent_devices >"$QS/agent.log" 2>&1 &
pids="$! $pids"

echo "== creating a tenant and its token"
LOOM_TOKEN=$LOOM_ADMIN_TOKEN "$BIN/loomctl" --json tenant-create quickstart \
    --data-root "$QS/data" >"$QS/tenant.json"
tenant=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$QS/tenant.json")
LOOM_TOKEN=$LOOM_ADMIN_TOKEN "$BIN/loomctl" --json token-create "$tenant" >"$QS/token.json"
LOOM_TOKEN=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["token"])' "$QS/token.json")
export LOOM_TOKEN

if [ "$device" = cuda ]; then
    steps=${LOOM_QUICKSTART_STEPS:-300}
    precision=bf16 mbs=32 layers=6 dmodel=384 heads=6 seq=256
else
    steps=${LOOM_QUICKSTART_STEPS:-40}
    precision=fp32 mbs=8 layers=4 dmodel=128 heads=4 seq=128
fi
cat >"$QS/job.json" <<JSON
{
  "name": "quickstart-gpt",
  "labels": {"example": "quickstart"},
  "model": {"family": "gpt2", "n_layer": $layers, "n_head": $heads, "d_model": $dmodel,
            "vocab_size": 256, "seq_len": $seq},
  "data": {"train": "$QS/data/train_*.bin", "val": "$QS/data/val_*.bin"},
  "parallel": {"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0},
  "train": {"steps": $steps, "micro_batch": $mbs, "lr": 3e-3, "min_lr": 3e-4,
            "warmup_steps": 5, "schedule": "cosine", "precision": "$precision",
            "eval_every": $((steps / 2)), "eval_batches": 8},
  "checkpoint": {"every_steps": $((steps / 2)), "keep": 2},
  "resources": {"device": "$device", "gpus_per_node": 1},
  "max_retries": 2
}
JSON
echo "== submitting $QS/job.json"
"$BIN/loomctl" --json submit "$QS/job.json" >"$QS/submitted.json"
job=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$QS/submitted.json")
echo "   job $job"

echo "== following $job"
last=""
while :; do
    "$BIN/loomctl" --json get "$job" >"$QS/job-state.json"
    state=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["state"])' "$QS/job-state.json")
    if [ "$state" != "$last" ]; then
        echo "   state: $state"
        last=$state
    fi
    case "$state" in succeeded | failed | cancelled) break ;; esac
    sleep 1
done
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
echo "  loomd:           $LOOM_URL (admin token in LOOM_ADMIN_TOKEN of this run)"
