#!/bin/bash
# Kernel times of one training step of the Llama 3.2 1B shape (T 2048,
# micro-batch 4) under ncu: loom-gpu-bench runs 4 steps, the 4th (--ncu-step
# 3) alone between cudaProfilerStart / Stop, ncu records gpu__time_duration
# of each of its kernels. Summary: total kernel time, kernels by class
# (GEMM, attention, cross-entropy, norm, element-wise, optimizer, other) and
# the 25 costliest kernel names, one RESULT line with the class sums (ms).
# Usage: tests/gpu/device/profile_llama.sh   (BUILD: the carried build
# folder; LLAMA: the preset, default 1b; XENT: the xent-chunk-mib row).
# Logs under $OUT.
. "$(dirname "$0")/env.sh"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
csv=$OUT/ncu_llama.csv
LOOM_XENT_CHUNK_MIB=${XENT:-512} timeout 300 "$NCU" --profile-from-start off \
    --metrics gpu__time_duration.sum --csv "$BIN/loom-gpu-bench" --family llama \
    --model "${LLAMA:-1b}" --mbs 4 --T 2048 --warmup 3 --steps 1 --profile 0 --ncu-step 3 \
    >"$csv" 2>"$OUT/ncu_llama.err"
echo "ncu rc=$? $(el)"
python3 - "$csv" <<'PY'
import csv, re, sys
unit = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}
rows = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
by_name, n = {}, 0
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    ms = float(r["Metric Value"].replace(",", "")) * unit.get(r["Metric Unit"], 1e-6)
    name = r["Kernel Name"]
    t = by_name.setdefault(name, [0.0, 0])
    t[0] += ms
    t[1] += 1
    n += 1
classes = [("gemm", r"nvjet|gemm|cutlass|sm90_xmma|cublas"),
           ("attention", r"cudnn|flash|attn|fmha|sdpa"), ("xent", r"xent"),
           ("norm", r"norm"), ("optimizer", r"adamw|sum_part|sumsq|sum_final|scale"),
           ("elementwise", r"swiglu|rope|gelu|add|embed|accum|copy|bf16|f32|fill|memset")]
sums = {c: 0.0 for c, _ in classes}
sums["other"] = 0.0
for name, (ms, _) in by_name.items():
    c = next((c for c, rx in classes if re.search(rx, name, re.I)), "other")
    sums[c] += ms
total = sum(sums.values())
print("kernels %d, kernel time %.2f ms" % (n, total))
for c, ms in sums.items():
    print("  %-12s %8.2f ms" % (c, ms))
for name, (ms, k) in sorted(by_name.items(), key=lambda x: -x[1][0])[:25]:
    print("  %8.3f ms %4d x  %s" % (ms, k, name[:110]))
print("RESULT {\"profile\":\"ncu\",\"kernels\":%d,\"kernel_ms\":%.2f,%s}" % (
    n, total, ",".join("\"%s_ms\":%.2f" % (c, ms) for c, ms in sums.items())))
PY
grep -m3 -iE "error|==ERROR==" "$OUT/ncu_llama.err"
