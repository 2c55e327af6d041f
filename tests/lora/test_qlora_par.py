"""QLoRA (train.quantize_base "nf4") on several processes and its merged export.

  test_qlora_par.py LOOM_WORKER NF4_TOOL

A tiny HF-layout llama (tests/hf/make_tiny_hf.py) trained 10 steps with train.lora and an
NF4 base by the real loom-worker on cpu, on a data set of exactly one global batch:

1. Layouts. dp2 (ZeRO 0, 1, 2: every rank quantizes the whole base, only adapter gradients
   cross) and pp2 (each stage quantizes its own tensors, whole; untied and tied embeddings)
   and pp2 x dp2 follow the one-process QLoRA loss curve within 1e-6 relative, and their
   PEFT adapters and merged exports equal the one-process ones within fp32 rounding (1e-5
   and 1e-6 absolute); rank 0's planned params equal its allocated params on every layout.
2. Merged export. Every block linear weight of export.hf equals dequant(base) +
   (alpha/r) B A computed in numpy: the base quantized and dequantized by the independent
   numpy NF4 reference of tests/qlora/test_qlora.py, B and A from the PEFT export. Every
   other tensor equals the base (also with adapters on q and v only: the other NF4 weights
   dequantized); `--export` holds the same tensors. The merged weights' error against the
   fp32 base's merge is printed (relative RMS).
3. tp. With d_ff 128 (every shard boundary on a 64-weight block), tp2, tp2 x dp2 and
   tp2 x pp2 (each rank quantizes the whole tensors and keeps its shard) follow the
   one-process QLoRA run as the layouts of 1. do (loss curve, adapters, merged export,
   planner), and tp2 over a base drawn from the seed (no init_from) the one-process curve;
   the dequantized shards themselves are held bit-identical to the whole
   tensor's pieces by unit.nf4.shard. With the default d_ff 96, tp2 would cut down_proj's
   rows into 48 weights, inside a 64-weight block: refused (LORA_UNSUPPORTED, naming the
   tensor, tp and the sizes) and changes nothing.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf"))
sys.path.insert(0, os.path.join(HERE, "..", "qlora"))
import hfio  # noqa: E402
import make_tiny_hf  # noqa: E402
import test_qlora as nf4ref  # noqa: E402  (the numpy NF4 reference; reads argv 1 and 2)

WORKER = sys.argv[1]
failures = 0
SEQ, STEPS, RANK, ALPHA = nf4ref.SEQ, nf4ref.STEPS, nf4ref.RANK, nf4ref.ALPHA


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, file=sys.stderr)
    else:
        print("ok:", what)


def worker(args):
    p = subprocess.run([WORKER, "--log-level", "info", "--threads", "1"] + args,
                       capture_output=True, text=True, errors="replace", timeout=300)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    return p.returncode, lines, p.stderr


def losses(out):
    return [l["loss"] for l in out if l.get("type") == "step"]


def rel_curve(a, b):
    return max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=1.0) \
        if len(a) == len(b) == STEPS else 1.0


def adapters(run):
    st = hfio.read_safetensors(os.path.join(run, "export", "lora", "adapter_model.safetensors"))
    return {k: hfio.to_float(*v) for k, v in st.items()}


def merged(run):
    return {k: hfio.to_float(*v) for k, v in
            hfio.read_model_dir(os.path.join(run, "export", "hf")).items()}


def max_diff(a, b):
    if set(a) != set(b) or any(a[k].shape != b[k].shape for k in a):
        return float("inf")
    return max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a)


def planner_matches(out):
    mem = [l for l in out if l.get("type") == "memory"]
    return bool(mem) and all(abs(m["planned_gib"]["params"] - m["allocated_gib"]["params"]) *
                             2**30 < 0.5 for m in mem), mem[:1]


def model(tmp, name, tied, seed, ffn=make_tiny_hf.F):
    hf = os.path.join(tmp, name)
    rng = np.random.default_rng(seed)
    cfg = make_tiny_hf.config("LlamaForCausalLM", "F32", tied,
                              {"rope_theta": 10000.0, "rms_norm_eps": 1e-5})
    cfg["intermediate_size"] = ffn
    make_tiny_hf.write_dir(hf, cfg, make_tiny_hf.tensors("LlamaForCausalLM", tied, rng, ffn=ffn),
                           "F32", 1)
    return hf


def merged_check(hf, run, what):
    """export.hf == dequant(base) + alpha/r B A in numpy, the rest == the base."""
    base = {k: hfio.to_float(*v) for k, v in hfio.read_model_dir(hf).items()}
    ad, mg = adapters(run), merged(run)
    code, dmap = nf4ref.nf4_table(), nf4ref.dynamic_map()
    worst, quantized, e_num, e_den = 0.0, 0, 0.0, 0.0
    for k, w in base.items():
        want = w.astype(np.float64)
        if k.startswith("model.layers.") and k.endswith("_proj.weight"):
            f = w.astype(np.float32).reshape(-1)
            deq = nf4ref.dequantize(*nf4ref.quantize(f, code, dmap), code, dmap)
            want = deq.reshape(w.shape).astype(np.float64)
            quantized += 1
            name = k[:-len(".weight")]
            ka, kb = (f"base_model.model.{name}.lora_{x}.weight" for x in "AB")
            if ka in ad:
                BA = ad[kb].astype(np.float64) @ ad[ka].astype(np.float64)
                want = want + (ALPHA / RANK) * BA
                full = w.astype(np.float64) + (ALPHA / RANK) * BA  # the fp32 base's merge
                e_num += float(((want - full) ** 2).sum())
                e_den += float((full ** 2).sum())
        got = mg.get(k)
        if got is None or got.shape != w.shape:
            worst = float("inf")
            continue
        worst = max(worst, float(np.abs(got.astype(np.float64) - want).max()))
    check(set(mg) == set(base) and quantized > 0 and worst <= 1e-6,
          f"{what}: merged export equals numpy's dequant(base) + alpha/r B A over {quantized} "
          f"NF4 weights, the rest the base (max abs diff {worst:.3g})")
    if e_den > 0:
        print(f"{what}: merged weights vs the fp32 base's merge, relative RMS "
              f"{(e_num / e_den) ** 0.5:.4f} (the NF4 error of the base)")


def spec(path, hf, data, seqs, parallel=None, export=None, targets=None):
    nf4ref.spec(path, hf, data, export=export, parallel=parallel)
    s = json.load(open(path))
    s["train"]["global_batch_tokens"] = seqs * SEQ  # the whole data set, one micro-batch each
    if targets:
        s["train"]["lora"]["targets"] = targets
    json.dump(s, open(path, "w"))


def dataset(tmp, seqs):
    data = os.path.join(tmp, f"data{seqs}")
    os.makedirs(data)
    n = seqs * SEQ + 1  # exactly one global batch
    toks = [(i * 7919 + i * i * 31) % make_tiny_hf.V for i in range(n)]
    with open(os.path.join(data, "train_000.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *toks))
    return data


def layouts(tmp, hf, data, seqs, tag, cases):
    sp = os.path.join(tmp, f"one-{tag}.json")
    run1 = os.path.join(tmp, f"run-one-{tag}")
    spec(sp, hf, data, seqs, export={"lora": True, "hf": True})
    flat = os.path.join(tmp, f"flat-{tag}.safetensors")
    rc, out, err = worker(["--spec", sp, "--out", run1, "--export", flat])
    check(rc == 0, f"{tag}: one-process QLoRA run, export.hf and --export rc={rc} {err[-600:]}")
    if rc != 0:
        return
    fl = {k: hfio.to_float(*v) for k, v in hfio.read_safetensors(flat).items()}
    df = max_diff(fl, merged(run1))
    check(df == 0, f"{tag}: --export holds the tensors of export.hf (max diff {df:.3g})")
    got1 = losses(out)
    check(len(got1) == STEPS and got1[-1] < got1[0] - 1e-3, f"{tag}: the loss goes down {got1}")
    ok, mem = planner_matches(out)
    check(ok, f"{tag}: one process, planner params equal the allocated params {mem}")
    merged_check(hf, run1, f"{tag} one process")
    ad1, mg1 = adapters(run1), merged(run1)
    for name, par, nproc in cases:
        spp = os.path.join(tmp, f"{tag}-{name}.json")
        runp = os.path.join(tmp, f"run-{tag}-{name}")
        spec(spp, hf, data, seqs, parallel=par, export={"lora": True, "hf": True})
        rc, out, err = worker(["--spec", spp, "--out", runp, "--nproc", str(nproc)])
        gp = losses(out)
        rel = rel_curve(gp, got1)
        print(f"{tag} {name:6s}:", gp)
        check(rc == 0 and rel <= 1e-6,
              f"{tag} {name}: QLoRA loss curve equals one process's within 1e-6 relative "
              f"(max {rel:.3g}) rc={rc} {err[-600:]}")
        if rc != 0:
            continue
        ok, mem = planner_matches(out)
        check(ok, f"{tag} {name}: planner params equal the allocated params {mem}")
        # fp32 rounding of another summation order (pp: the stages' norm pieces)
        da = max_diff(adapters(runp), ad1)
        check(da <= 1e-5, f"{tag} {name}: PEFT adapter equals one process's (max {da:.3g})")
        dm = max_diff(merged(runp), mg1)
        check(dm <= 1e-6, f"{tag} {name}: merged export equals one process's (max {dm:.3g})")
        merged_check(hf, runp, f"{tag} {name}")


def some_targets(tmp, hf, data):
    """Adapters on q and v only: the other NF4 weights are exported as dequant(base)."""
    sp = os.path.join(tmp, "qv.json")
    run = os.path.join(tmp, "run-qv")
    spec(sp, hf, data, 2, export={"lora": True, "hf": True}, targets=["q", "v"])
    rc, out, err = worker(["--spec", sp, "--out", run])
    check(rc == 0, f"targets q, v: QLoRA run with export.hf rc={rc} {err[-600:]}")
    if rc == 0:
        merged_check(hf, run, "targets q, v")


def seed_init_tp(tmp, data):
    """tp2 over a base drawn from the seed (model_init_params, no init_from) against one
    process: the other loader that hands the NF4 storage whole tensors."""
    curves = {}
    for name, par, nproc in (("one", None, 1), ("tp2", {"tp": 2}, 2)):
        sp = os.path.join(tmp, f"seed-{name}.json")
        s = {"name": "qlora-seed", "model": {"family": "llama", "preset": "mini", "seq_len": SEQ,
                                              "d_ff": 512},
             "data": {"train": f"{data}/train_*.bin"},
             "train": {"steps": STEPS, "global_batch_tokens": 2 * SEQ, "micro_batch": 1,
                       "lr": nf4ref.LR, "warmup_steps": 0, "schedule": "constant", "seed": 3,
                       "lora": {"rank": RANK, "alpha": ALPHA, "targets": nf4ref.TARGETS},
                       "quantize_base": "nf4"},
             "checkpoint": {"every_steps": 0, "keep": 1}, "resources": {"device": "cpu"}}
        if par:
            s["parallel"] = par
        json.dump(s, open(sp, "w"))
        rc, out, err = worker(["--spec", sp, "--out", os.path.join(tmp, f"run-seed-{name}"),
                               "--nproc", str(nproc)])
        check(rc == 0, f"seed-initialised base, {name}: rc={rc} {err[-600:]}")
        curves[name] = losses(out)
    rel = rel_curve(curves["tp2"], curves["one"])
    check(rel <= 1e-6, f"seed-initialised base: tp2 QLoRA loss curve equals one process's within "
          f"1e-6 relative (max {rel:.3g})")


def tp_refused(tmp, hf, data):
    spt = os.path.join(tmp, "tp2.json")
    spec(spt, hf, data, 2, parallel={"tp": 2})
    run = os.path.join(tmp, "run-tp2")
    rc, out, err = worker(["--spec", spt, "--out", run, "--nproc", "2"])
    errs = [l for l in out if l.get("type") == "error"]
    msg = errs[0].get("message", "") if errs else err
    coded = (errs[0].get("code") == "LORA_UNSUPPORTED") if errs else \
        "LORA_UNSUPPORTED: train.quantize_base nf4" in err
    named = all(w in msg for w in ("tp=2", "down_proj", "[128, 96]", "48 weights", "dp / pp"))
    check(rc != 0 and coded and named,
          f"quantize_base nf4 with tp=2 and d_ff 96 refused, naming the tensor, its shape, the "
          f"shard's 48-weight runs, tp and dp / pp: rc={rc} {errs[:1]} {err[-300:]}")
    check(not any(l.get("type") == "step" for l in out), "the refused tp2 run trains no step")


def main():
    tmp = tempfile.mkdtemp(prefix="loom-qlora-par-")
    try:
        data2, data4 = dataset(tmp, 2), dataset(tmp, 4)
        hf = model(tmp, "llama", False, 78)
        layouts(tmp, hf, data2, 2, "untied",
                (("dp2-z0", {"dp": 2, "zero_stage": 0}, 2),
                 ("dp2-z1", {"dp": 2, "zero_stage": 1}, 2),
                 ("dp2-z2", {"dp": 2, "zero_stage": 2}, 2),
                 ("pp2", {"pp": 2}, 2)))
        # pp with dp: two micro-batches a dp rank (1F1B's minimum), so four sequences
        layouts(tmp, hf, data4, 4, "untied-4seq",
                (("pp2-dp2", {"pp": 2, "dp": 2, "zero_stage": 1}, 4),))
        hft = model(tmp, "llama-tied", True, 79)  # the last stage's copy of the embedding
        layouts(tmp, hft, data2, 2, "tied", (("pp2", {"pp": 2}, 2),))
        some_targets(tmp, hf, data2)
        # tp: d_ff 128, so down_proj's rows split into 64 weights a rank
        hf128 = model(tmp, "llama-ff128", False, 80, ffn=128)
        layouts(tmp, hf128, data2, 2, "ff128",
                (("tp2", {"tp": 2}, 2),
                 ("tp2-dp2", {"tp": 2, "dp": 2, "zero_stage": 1}, 4),
                 ("tp2-pp2", {"tp": 2, "pp": 2}, 4)))
        seed_init_tp(tmp, data2)
        tp_refused(tmp, hf, data2)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("failures:", failures)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
