#!/bin/sh
# Side-by-side training throughput on one GPU: Loom (the engine's model and
# train_step on the CUDA backend, driven by loom-gpu-bench) and the PyTorch
# peer (the PyTorch peer gpt2_torch_bench.py (see docs/perf.md): torch.compile, bf16 autocast,
# SDPA flash attention, fused AdamW), one after the other, same shapes.
# Prints tokens/s, MFU (6N + 12*L*C*T FLOPs per token vs 989 TFLOP/s), peak
# memory and the ratio loom / torch.
# Usage: tests/bench/gpu_bench.sh [MODEL [MBS [T]]]   (default 124m 16 1024)
# Env: BUILD (default build-cuda), PEER (default .deps/peers/gpt2_torch_bench.py),
#      SKIP_PEER=1 to run Loom only.
set -u
cd "$(dirname "$0")/../.."
MODEL=${1:-124m}
MBS=${2:-16}
T=${3:-1024}
BUILD=${BUILD:-build-cuda}
PEER=${PEER:-.deps/peers/gpt2_torch_bench.py}
export NCCL_NVLS_ENABLE=0
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_bench: no GPU found: nothing measured"
    exit 77
fi
tmp=$(mktemp -d)
echo "gpu_bench: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), model $MODEL, mbs $MBS, T $T"
"$BUILD/bin/loom-gpu-bench" --model "$MODEL" --mbs "$MBS" --T "$T" >"$tmp/loom.out" 2>"$tmp/loom.err"
echo "loom rc=$?"
cat "$tmp/loom.err"
grep '^RESULT' "$tmp/loom.out"
# End to end: loom-worker itself on a random-token shard (data loader, JSON
# step lines, a final checkpoint), median tokens/s of steps after the 8th.
if [ -x "$BUILD/bin/loom-worker" ] && [ "$MODEL" = 124m ]; then
    python3 - "$tmp" "$MBS" "$T" <<'PY'
import json, sys, numpy as np
d, mbs, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
n = 48 * mbs * T + 1
hdr = np.zeros(256, dtype=np.int32); hdr[0], hdr[1], hdr[2] = 20240520, 1, n
tok = np.random.default_rng(1234).integers(0, 50257, n, dtype=np.uint16)
with open(d + "/train.bin", "wb") as f:
    f.write(hdr.tobytes()); f.write(tok.tobytes())
spec = {"name": "bench", "model": {"family": "gpt2", "preset": "124m"},
        "data": {"train": d + "/train.bin"},
        "parallel": {"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0},
        "train": {"steps": 40, "global_batch_tokens": mbs * T, "micro_batch": mbs, "lr": 6e-4,
                  "min_lr": 6e-5, "warmup_steps": 2, "schedule": "cosine", "weight_decay": 0.1,
                  "grad_clip": 1.0, "seed": 42, "precision": "bf16"},
        "checkpoint": {"every_steps": 1000, "keep": 1},
        "resources": {"device": "cuda", "gpus_per_node": 1}}
json.dump(spec, open(d + "/spec.json", "w"))
PY
    "$BUILD/bin/loom-worker" --spec "$tmp/spec.json" --device cuda --out "$tmp/run" \
        >"$tmp/worker.out" 2>"$tmp/worker.err"
    echo "loom-worker rc=$?"
    python3 - "$tmp/worker.out" "$tmp/worker.err" <<'PY'
import json, sys
steps = []
for l in open(sys.argv[1]):
    try: o = json.loads(l)
    except ValueError: continue
    if o.get("type") == "step": steps.append(o)
    if o.get("type") == "error": print("worker error:", o)
if not steps:
    print("loom-worker: no step lines; stderr tail:"); print(open(sys.argv[2]).read()[-1500:])
else:
    tps = sorted(s["tokens_per_s"] for s in steps[8:]) or [steps[-1]["tokens_per_s"]]
    print("loom-worker: %d steps, median tokens/s %.0f, mfu %s, mem_gib %s, last loss %.3f" % (
        len(steps), tps[len(tps) // 2], steps[-1].get("mfu"), steps[-1].get("mem_gib"),
        steps[-1]["loss"]))
    print("last step line:", json.dumps(steps[-1]))
PY
fi
if [ "${SKIP_PEER:-0}" != 1 ]; then
    PYTHONUNBUFFERED=1 python3 "$PEER" --model "$MODEL" --mbs "$MBS" --T "$T" --compile 1 \
        >"$tmp/peer.out" 2>"$tmp/peer.err"
    echo "peer rc=$?"
    grep '^RESULT' "$tmp/peer.out" || tail -20 "$tmp/peer.err"
fi
python3 - "$tmp/loom.out" "$tmp/peer.out" <<'PY'
import json, sys
def res(p):
    try:
        for l in open(p):
            if l.startswith("RESULT "): return json.loads(l[7:])
    except OSError:
        pass
    return None
a, b = res(sys.argv[1]), res(sys.argv[2])
print("%-8s %12s %10s %7s %9s" % ("impl", "tokens/s", "step ms", "MFU", "mem GiB"))
for name, r in (("loom", a), ("torch", b)):
    if r:
        print("%-8s %12d %10.2f %7.3f %9.1f" % (name, r["tokens_per_s"], r["step_ms_median"],
                                                r["mfu_vs_989"], r["max_mem_gib"]))
    else:
        print("%-8s %12s" % (name, "no result"))
if a and b:
    print("ratio loom/torch tokens/s: %.3f" % (a["tokens_per_s"] / b["tokens_per_s"]))
PY
rm -rf "$tmp"
