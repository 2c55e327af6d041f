#!/usr/bin/env python3
"""Multi-GPU checks and benchmarks of loom-worker on the GPU machine (ctest
gpu.dist.curves; tests/gpu/device/check_all.sh curves, bench_gpt2.sh and
bench_dist.sh).

  dist_check.py curves BIN DIR [layouts]
      A small GPT-2 (4 layers, d 256, vocab 4096, T 256) on a learnable
      synthetic shard (noisy affine bigram chain), 50 steps: the 1-GPU run
      (dp 1, 2 micro-steps of accumulation) is the reference; every layout
      (default dp2 with zero 0/1/2/3; tp2, pp2 when asked) runs with the same
      global batch and must follow its loss curve within bf16 tolerance:
      each step <= 5 % relative, mean <= 1 % (llm.c / Megatron use a few %).
      Prints one line per layout and exits 1 when any fails (77: fewer
      than 2 GPUs; ctest gpu.dist.curves).
  dist_check.py bench BIN DIR MODEL MBS NPROC ZERO [STEPS] [EXTRA]
      loom-worker --nproc NPROC end to end on a random-token shard (global
      batch = MBS*1024*dp*accum): median tokens/s of the steps after the
      8th, exposed comm ms, memory; prints 'RESULT {json}'. EXTRA: tp=2,
      pp=2,accum=8, offload=1, recompute=full, nosave=1, n_layer=.. (see
      bench()).
Plain Python (no numpy needed).
"""
import array, json, os, random, subprocess, sys, time

ENV = dict(os.environ, NCCL_NVLS_ENABLE="0")


def write_shard(path, n, vocab, structured, seed):
    hdr = array.array("i", [0] * 256)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, n
    rng = random.Random(seed)
    tok = array.array("H", bytes(2 * n))
    if structured:
        # x[i+1] = (31*x[i] + 7) mod V with prob 0.8, else uniform: learnable
        x = 1
        for i in range(n):
            tok[i] = x
            x = rng.randrange(vocab) if rng.random() < 0.2 else (31 * x + 7) % vocab
    else:
        raw = array.array("H", os.urandom(2 * n))
        for i in range(n):
            tok[i] = raw[i] % vocab
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(tok.tobytes())


def spec(data, model, par, steps, gbt, mbs, lr=6e-4):
    return {"name": "dist", "model": model, "data": {"train": data},
            "parallel": par,
            "train": {"steps": steps, "global_batch_tokens": gbt, "micro_batch": mbs, "lr": lr,
                      "min_lr": lr / 10, "warmup_steps": 5, "schedule": "cosine",
                      "weight_decay": 0.1, "grad_clip": 1.0, "seed": 42, "precision": "bf16"},
            "checkpoint": {"every_steps": 100000, "keep": 1},
            "resources": {"device": "cuda", "gpus_per_node": 8}}


def run_worker(binp, d, name, sp, nproc, timeout=280, flags=(), env=None):
    sf = os.path.join(d, name + ".json")
    subprocess.run(["rm", "-rf", os.path.join(d, name + ".run")])  # never resume an older run
    json.dump(sp, open(sf, "w"))
    cmd = [os.path.join(binp, "loom-worker"), "--spec", sf, "--device", "cuda",
           "--out", os.path.join(d, name + ".run")]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    cmd += list(flags)
    t0 = time.time()
    with open(os.path.join(d, name + ".out"), "w") as fo, \
            open(os.path.join(d, name + ".err"), "w") as fe:
        try:
            rc = subprocess.run(cmd, stdout=fo, stderr=fe, env=env or ENV,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.time() - t0
    steps, errors = [], []
    for l in open(os.path.join(d, name + ".out")):
        try:
            o = json.loads(l)
        except ValueError:
            continue
        if o.get("type") == "step":
            steps.append(o)
        elif o.get("type") == "error":
            errors.append(o.get("message"))
    return rc, steps, errors, wall


def tail(d, name, n=1200):
    try:
        return open(os.path.join(d, name + ".err")).read()[-n:]
    except OSError:
        return ""


def rank_hashes(d, name):
    """{rank: hash} of the "param hash rank R: H" lines (LOOM_DEBUG_PARAM_HASH=1:
    every rank holding all fp32 weights logs their hash at the end)."""
    out = {}
    for l in open(os.path.join(d, name + ".err"), errors="replace"):
        i = l.find("param hash rank ")
        if i >= 0:
            r, h = l[i + len("param hash rank "):].split(":")[:2]
            out[int(r)] = h.split()[0]
    return out


def curves(binp, d, layouts):
    V, T, mbs = 4096, 256, 8
    model = {"family": "gpt2", "n_layer": 4, "n_head": 4, "d_model": 256, "d_ff": 1024,
             "vocab_size": V, "seq_len": T}
    data = os.path.join(d, "curve.bin")
    write_shard(data, 200 * 2 * mbs * T + 1, V, True, 7)
    gbt = 2 * mbs * T
    steps = 50
    rc, ref, err, wall = run_worker(binp, d, "ref", spec(data, model, {"dp": 1, "tp": 1, "pp": 1,
                                                                       "zero_stage": 0},
                                                         steps, gbt, mbs, 1e-3), 1)
    if rc != 0 or len(ref) != steps:
        print("dist ref 1-GPU: FAIL rc=%d steps=%d %s\n%s" % (rc, len(ref), err, tail(d, "ref")))
        return 1
    print("dist ref 1-GPU: %d steps in %.1f s, loss %.4f -> %.4f" % (
        len(ref), wall, ref[0]["loss"], ref[-1]["loss"]))
    bad = 0
    for lay in layouts:
        par = {"dp": 1, "tp": 1, "pp": 1, "zero_stage": 0}
        offload = False
        for kv in lay.split(","):
            k, v = kv.split("=")
            if k == "offload":  # train.offload_optimizer, not a layout key
                offload = v == "1"
            elif k == "pp_balance":  # a boolean in the spec
                par[k] = v == "1"
            else:
                par[k] = int(v)
        n = par["dp"] * par["tp"] * par["pp"]
        name = "lay_" + lay.replace(",", "_").replace("=", "")
        sp = spec(data, model, par, steps, gbt, mbs, 1e-3)
        sp["train"]["offload_optimizer"] = offload
        rc, st, err, wall = run_worker(binp, d, name, sp, n,
                                       env=dict(ENV, LOOM_DEBUG_PARAM_HASH="1"))
        if rc != 0 or len(st) != steps:
            print("dist %s: FAIL rc=%d steps=%d %s\n%s" % (lay, rc, len(st), err, tail(d, name)))
            bad = 1
            continue
        # pure data parallelism with whole weights on every rank (ZeRO 0): the
        # ranks must end bit-identical
        hs = rank_hashes(d, name)
        same = "n/a"
        if par["tp"] == 1 and par["pp"] == 1 and par["zero_stage"] == 0 and par["dp"] > 1:
            same = "yes" if len(hs) == par["dp"] and len(set(hs.values())) == 1 else "NO"
            bad |= same != "yes"
        rel = [abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(st, ref)]
        gn = [abs(a["grad_norm"] - b["grad_norm"]) / max(abs(b["grad_norm"]), 1e-6)
              for a, b in zip(st, ref)]
        ok = max(rel) <= 0.05 and sum(rel) / len(rel) <= 0.01
        bad |= not ok
        print("dist %s: %s %d steps in %.1f s, loss rel diff max %.2e mean %.2e (grad_norm max "
              "%.2e), final %.4f vs %.4f, comm_exposed %.2f ms, ranks' weights identical: %s %s" % (
                  lay, "ok" if ok and same != "NO" else "FAIL", len(st), wall, max(rel),
                  sum(rel) / len(rel), max(gn), st[-1]["loss"], ref[-1]["loss"],
                  st[-1]["ms"]["comm_exposed"], same, sorted(hs.items()) if same == "NO" else ""))
    return bad


def bench(binp, d, model, mbs, nproc, zero, steps, extra=""):
    """extra: comma-separated key=value: tp, pp (dp = nproc / (tp*pp)), accum
    (micro-batches per step, default 1; pp needs several), offload=1, pp_balance=1,
    recompute=none|selective|full, nosave=1 (worker --no-save), and model
    shape overrides n_layer, n_head, d_model, d_ff (a GPT-2-style model of
    that shape, vocab 50257, T 1024, instead of the preset)."""
    T = 1024
    kv = dict(x.split("=", 1) for x in extra.split(",") if x)
    tp, pp, accum = int(kv.get("tp", 1)), int(kv.get("pp", 1)), int(kv.get("accum", 1))
    dp = nproc // (tp * pp)
    data = os.path.join(d, "bench.bin")
    need = (steps + 4) * mbs * T * dp * accum + 1
    if not os.path.exists(data) or os.path.getsize(data) < 1024 + 2 * need:
        write_shard(data, need, 50257, False, 1234)
    par = {"dp": dp, "tp": tp, "pp": pp, "zero_stage": zero}
    mdl = {"family": "gpt2", "preset": model}
    shape = {k: int(kv[k]) for k in ("n_layer", "n_head", "d_model", "d_ff") if k in kv}
    if shape:
        mdl = {"family": "gpt2", "vocab_size": 50257, "seq_len": T}
        mdl.update(shape)
        mdl.setdefault("d_ff", 4 * mdl["d_model"])
    name = "bench_%s_%d_z%d%s" % (model, nproc, zero, extra.replace(",", "_").replace("=", ""))
    sp = spec(data, mdl, par, steps, mbs * T * dp * accum, mbs)
    if kv.get("offload") == "1":
        sp["train"]["offload_optimizer"] = True
    if kv.get("pp_balance") == "1":
        sp["parallel"]["pp_balance"] = True
    if "recompute" in kv:
        sp["train"]["recompute"] = kv["recompute"]
    flags = ["--no-save"] if kv.get("nosave") == "1" else []
    rc, st, err, wall = run_worker(binp, d, name, sp, nproc, timeout=int(kv.get("timeout", 400)),
                                   flags=flags)
    if rc != 0 or not st:
        print("bench %s: FAIL rc=%d %s\n%s" % (name, rc, err, tail(d, name)))
        return 1
    later = st[8:] or st[-1:]
    tps = sorted(s["tokens_per_s"] for s in later)
    ce = sorted(s["ms"]["comm_exposed"] for s in later)
    ms = sorted(s["ms"]["step"] for s in later)
    r = {"model": model, "nproc": nproc, "zero": zero, "mbs": mbs, "extra": extra,
         "steps": len(st), "tokens_per_s": tps[len(tps) // 2], "step_ms": ms[len(ms) // 2],
         "comm_exposed_ms": ce[len(ce) // 2], "mfu": st[-1].get("mfu"),
         "mem_gib": st[-1].get("mem_gib"), "loss": [st[0]["loss"], st[-1]["loss"]],
         "wall_s": round(wall, 1)}
    for k in ("pp", "ms"):
        if k in st[-1]:
            r["last_" + k] = st[-1][k]
    for l in open(os.path.join(d, name + ".out")):
        if '"type":"memory"' in l and '"rank":0' in l:
            r["memory"] = json.loads(l)
    print("RESULT " + json.dumps(r))
    return 0


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    except OSError:
        return 0
    return sum(1 for l in out.splitlines() if l.startswith("GPU "))


def main():
    a = sys.argv
    if len(a) >= 3 and gpu_count() < 2:
        print("SKIP: %d GPU(s); dist_check needs at least 2" % gpu_count())
        return 77
    if len(a) >= 4:
        os.makedirs(a[3], exist_ok=True)
    if len(a) >= 4 and a[1] == "curves":
        lays = a[4].split(";") if len(a) > 4 else ["dp=2,zero_stage=%d" % z for z in range(4)]
        return curves(a[2], a[3], lays)
    if len(a) >= 8 and a[1] == "bench":
        return bench(a[2], a[3], a[4], int(a[5]), int(a[6]), int(a[7]),
                     int(a[8]) if len(a) > 8 else 40, a[9] if len(a) > 9 else "")
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
