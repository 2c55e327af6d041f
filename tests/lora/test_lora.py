"""LoRA fine-tuning through the real loom-worker against an independent torch reference.

  test_lora.py LOOM_WORKER

A tiny HF-layout llama (tests/hf/make_tiny_hf.py) is trained with train.lora for 10 steps
on a data set of exactly one global batch (two sequences), so every step sees the same
tokens. The reference (torch, float64) implements the llama forward, LoRA
(y = W x + alpha/r * B A x) and AdamW with global-norm clipping itself; it starts from the
worker's A (exported after one step at lr 0, which leaves the adapters unchanged) and B = 0.
Checked: the loss curve (1e-5 relative), step-1 loss equal to full fine-tuning's, the PEFT
names and config, the merged export (base + alpha/r B A in numpy), and the refusals.
Parallel layouts (dp2 with ZeRO 0-2, tp2, pp2, tp2 x pp2, tp2 x dp2) are proven by
equivalence: their curves follow the torch reference and the one-process curve, and their
PEFT exports (gathered whole tensors) and merged exports equal the one-process ones within
fp32 rounding; dropout, checkpoint resume and PEFT init_from under tp / pp too.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf"))
import hfio  # noqa: E402
import make_tiny_hf  # noqa: E402
import ref_forward  # noqa: E402

WORKER = sys.argv[1]
failures = 0
SEQ, STEPS, RANK, ALPHA, LR, WD, CLIP = 32, 10, 4, 8.0, 3e-3, 0.01, 1.0
TARGETS = ["q", "k", "v", "o", "gate", "up", "down"]
MODULE = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
          "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
          "down": "mlp.down_proj"}


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


def spec(path, init, data, lora=True, steps=STEPS, lr=LR, export=None, seq=SEQ, **lora_kw):
    s = {"name": "lora-test", "model": {"init_from": init, "seq_len": seq},
         "data": {"train": f"{data}/train_*.bin"},
         "train": {"steps": steps, "global_batch_tokens": 2 * seq, "micro_batch": 1, "lr": lr,
                   "warmup_steps": 0, "schedule": "constant", "seed": 5, "weight_decay": WD,
                   "grad_clip": CLIP, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8},
         "checkpoint": {"every_steps": 0, "keep": 1}, "resources": {"device": "cpu"}}
    if lora:
        s["train"]["lora"] = dict({"rank": RANK, "alpha": ALPHA, "dropout": 0.0,
                                   "targets": TARGETS}, **lora_kw)
    if export:
        s["export"] = export
    json.dump(s, open(path, "w"))


def reference(cfg, base, toks, A0, steps=STEPS):
    """`steps` steps of LoRA + AdamW in float64; returns the losses."""
    D = torch.float64
    scale = ALPHA / RANK
    A = {n: torch.tensor(a, dtype=D, requires_grad=True) for n, a in A0.items()}
    B = {n: torch.zeros((base[n + ".weight"].shape[0], RANK), dtype=D, requires_grad=True)
         for n in A0}
    params = list(A.values()) + list(B.values())
    state = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for p in params}
    seqs = [toks[0:SEQ + 1], toks[SEQ:2 * SEQ + 1]]
    out = []
    for step in range(1, steps + 1):
        w = dict(base)
        for n in A:  # merged weights keep autograd through A and B
            w[n + ".weight"] = base[n + ".weight"] + scale * (B[n] @ A[n])
        loss = 0
        for s in seqs:
            lg = ref_forward.llama_logits(cfg, w, s[:-1])
            loss = loss + torch.nn.functional.cross_entropy(lg, torch.tensor(s[1:]),
                                                            reduction="sum")
        loss = loss / (2 * SEQ)
        for p in params:
            p.grad = None
        loss.backward()
        out.append(loss.item())
        norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in params))
        clip = min(1.0, CLIP / (norm + 1e-6))
        with torch.no_grad():
            for p in params:
                m, v = state[id(p)]
                g = p.grad * clip
                m.mul_(0.9).add_(0.1 * g)
                v.mul_(0.95).add_(0.05 * g * g)
                mh, vh = m / (1 - 0.9 ** step), v / (1 - 0.95 ** step)
                p.sub_(LR * (mh / (vh.sqrt() + 1e-8) + WD * p))
    return out


def gpt2_part(tmp):
    """GPT-2: PEFT names of the Conv1D modules and the merged export in HF's [in, out] layout."""
    seq = make_tiny_hf.POS  # GPT-2 keeps its learned positions
    data = os.path.join(tmp, "data-gpt2")
    os.makedirs(data)
    n = 2 * seq + 1
    with open(os.path.join(data, "train_000.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *[(i * 131 + 7) % make_tiny_hf.V for i in range(n)]))
    hf = os.path.join(tmp, "gpt2")
    cfg = make_tiny_hf.config("GPT2LMHeadModel", "F32", True, {})
    make_tiny_hf.write_dir(hf, cfg, make_tiny_hf.tensors("GPT2LMHeadModel", True,
                                                         np.random.default_rng(78)), "F32", 1)
    sp = os.path.join(tmp, "gpt2.json")
    spec(sp, hf, data, steps=3, export={"hf": True, "lora": True}, seq=seq,
         targets=["attn", "proj", "fc", "fc2"])
    run = os.path.join(tmp, "run-gpt2")
    rc, out, err = worker(["--spec", sp, "--out", run])
    check(rc == 0 and len(losses(out)) == 3, f"gpt2 lora run rc={rc} {err[-300:]}")
    if rc != 0:
        return
    acfg = json.load(open(os.path.join(run, "export", "lora", "adapter_config.json")))
    check(acfg.get("target_modules") == ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"] and
          acfg.get("fan_in_fan_out") is True, f"gpt2 adapter_config.json {acfg}")
    st = hfio.read_safetensors(os.path.join(run, "export", "lora", "adapter_model.safetensors"))
    mods = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    names = {f"base_model.model.transformer.h.{i}.{m}.lora_{x}.weight"
             for m in mods for i in range(cfg["n_layer"]) for x in "AB"}
    check(set(st) == names, f"gpt2 PEFT tensor names ({sorted(st)[:2]}..)")
    base = {k: hfio.to_float(*v) for k, v in hfio.read_model_dir(hf).items()}
    merged = {k: hfio.to_float(*v) for k, v in
              hfio.read_model_dir(os.path.join(run, "export", "hf")).items()}
    worst, moved = 0.0, 0.0
    for k, b in base.items():
        want = b.astype(np.float64)
        name = k[:-len(".weight")]
        ka = f"base_model.model.{name}.lora_A.weight"
        if ka in st:
            Am = hfio.to_float(*st[ka]).astype(np.float64)
            Bm = hfio.to_float(*st[f"base_model.model.{name}.lora_B.weight"]).astype(np.float64)
            delta = (ALPHA / RANK) * (Bm @ Am).T  # Conv1D weights are [in, out]
            moved = max(moved, float(np.abs(delta).max()))
            want = want + delta
        if k in merged:
            worst = max(worst, float(np.abs(merged[k] - want).max()))
    check(moved > 1e-4 and worst <= 1e-6,
          f"gpt2 merged export (max abs diff {worst:.3g}, largest update {moved:.3g})")
    # tp2: c_attn's B splits per q|k|v block as the fused weight does; pp2 (with full
    # recompute): the last stage's tied embedding is a frozen copy there. Adam's eps raised
    # for both runs: some of this model's adapter gradients are ~0, and Adam would turn
    # their fp32 rounding (which differs between layouts) into steps of +-lr
    sg = json.load(open(sp))
    sg["export"] = {"lora": True}
    sg["train"]["eps"] = 1e-4
    st1 = None
    for par, nproc, d in ((None, 1, "run-gpt2-eps"), ({"tp": 2}, 2, "run-gpt2-tp2"),
                          ({"pp": 2}, 2, "run-gpt2-pp2")):
        if par:
            sg["parallel"] = par
        if par == {"pp": 2}:
            sg["train"]["recompute"] = "full"
        json.dump(sg, open(sp, "w"))
        runt = os.path.join(tmp, d)
        rc, out2, err = worker(["--spec", sp, "--out", runt, "--nproc", str(nproc)])
        check(rc == 0 and len(losses(out2)) == 3, f"gpt2 {d} rc={rc} {err[-300:]}")
        if rc != 0:
            return
        stt = hfio.read_safetensors(os.path.join(runt, "export", "lora",
                                                 "adapter_model.safetensors"))
        if st1 is None:
            st1, l1 = stt, losses(out2)
            continue
        rel = max((abs(a - b) / abs(b) for a, b in zip(losses(out2), l1)), default=1.0)
        check(rel <= 1e-6, f"gpt2 {d} loss curve vs one process (max {rel:.3g})")
        dt = max(float(np.abs(hfio.to_float(*stt[k]) - hfio.to_float(*st1[k])).max())
                 for k in st1 if k in stt)
        check(set(stt) == set(st1) and dt <= 1e-5,
              f"gpt2 {d} adapters equal one process's ({dt:.3g})")


def main():
    tmp = tempfile.mkdtemp(prefix="loom-lora-")
    hf = os.path.join(tmp, "llama")
    rng = np.random.default_rng(77)
    cfg = make_tiny_hf.config("LlamaForCausalLM", "F32", False,
                              {"rope_theta": 10000.0, "rms_norm_eps": 1e-5})
    make_tiny_hf.write_dir(hf, cfg, make_tiny_hf.tensors("LlamaForCausalLM", False, rng),
                           "F32", 1)
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    n = 2 * SEQ + 1  # exactly two samples: the global batch
    toks = [(i * 7919 + i * i * 31) % make_tiny_hf.V for i in range(n)]
    with open(os.path.join(data, "train_000.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *toks))

    # the initial adapters: one step at lr ~0 (A keeps its value, B stays 0)
    sp = os.path.join(tmp, "init.json")
    spec(sp, hf, data, steps=1, lr=1e-12)
    rc, out, err = worker(["--spec", sp, "--out", os.path.join(tmp, "run0"), "--export-lora",
                           os.path.join(tmp, "init")])
    check(rc == 0, f"initial run rc={rc} {err[-400:]}")
    init = hfio.read_safetensors(os.path.join(tmp, "init", "adapter_model.safetensors")) \
        if rc == 0 else {}
    # step-1 loss equals full fine-tuning's
    spf = os.path.join(tmp, "full.json")
    spec(spf, hf, data, lora=False, steps=1)
    rcf, outf, errf = worker(["--spec", spf, "--out", os.path.join(tmp, "runf")])
    check(rcf == 0 and losses(outf) and losses(out) and
          abs(losses(outf)[0] - losses(out)[0]) <= 1e-6 * abs(losses(outf)[0]),
          f"step-1 loss with LoRA equals full fine-tuning's: {losses(out)} vs {losses(outf)}")

    # 10 steps, adapter + merged exports
    sp = os.path.join(tmp, "lora.json")
    run = os.path.join(tmp, "run")
    spec(sp, hf, data, export={"hf": True, "lora": True})
    rc, out, err = worker(["--spec", sp, "--out", run])
    check(rc == 0, f"lora run rc={rc} {err[-400:]}")
    got = losses(out)

    cfgj, base = ref_forward.load(hf)
    A0 = {}
    for t in TARGETS:
        for layer in range(cfg["num_hidden_layers"]):
            name = f"model.layers.{layer}.{MODULE[t]}"
            key = f"base_model.model.{name}.lora_A.weight"
            if key in init:
                A0[name] = hfio.to_float(*init[key])
    check(len(A0) == len(TARGETS) * cfg["num_hidden_layers"], f"initial A of {len(A0)} adapters")
    Bkeys = [k for k in init if k.endswith("lora_B.weight")]
    # B starts at 0; the one step moved it by at most ~lr (Adam's normalised step)
    check(Bkeys and all(np.abs(hfio.to_float(*init[k])).max() <= 2e-12 for k in Bkeys),
          "B starts at 0")
    bounds = [np.abs(a).max() <= 1 / math.sqrt(a.shape[1]) and np.abs(a).max() > 0.5 /
              math.sqrt(a.shape[1]) for a in A0.values()]
    check(bounds and all(bounds), "A is U(-1/sqrt(in), 1/sqrt(in))")
    want = reference(cfgj, base, toks, A0) if A0 else []
    rel = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=1.0)
    print("loom  :", got)
    print("torch :", want)
    check(len(got) == STEPS and len(want) == STEPS and rel <= 1e-5,
          f"10-step loss curve vs torch within 1e-5 relative (max {rel:.3g})")
    check(len(got) == STEPS and got[-1] < got[0] - 1e-3, "the loss goes down")

    # PEFT adapter
    ad = os.path.join(run, "export", "lora")
    acfg = json.load(open(os.path.join(ad, "adapter_config.json")))
    check(acfg.get("peft_type") == "LORA" and acfg.get("r") == RANK and
          acfg.get("lora_alpha") == ALPHA and acfg.get("base_model_name_or_path") == hf and
          sorted(acfg.get("target_modules", [])) ==
          sorted(m.split(".")[-1] for m in MODULE.values()), f"adapter_config.json {acfg}")
    st = hfio.read_safetensors(os.path.join(ad, "adapter_model.safetensors"))
    names = {f"base_model.model.model.layers.{layer}.{MODULE[t]}.lora_{x}.weight"
             for t in TARGETS for layer in range(cfg["num_hidden_layers"]) for x in "AB"}
    check(set(st) == names, f"PEFT tensor names ({len(st)} tensors)")
    shapes = all(st[f"base_model.model.{n}.lora_A.weight"][1] == (RANK, base[n + ".weight"]
                 .shape[1]) and st[f"base_model.model.{n}.lora_B.weight"][1] ==
                 (base[n + ".weight"].shape[0], RANK) for n in A0)
    check(shapes, "lora_A [r, in], lora_B [out, r]")

    # merged export = base + alpha/r B A (numpy)
    merged = {k: hfio.to_float(*v) for k, v in
              hfio.read_model_dir(os.path.join(run, "export", "hf")).items()}
    worst = 0.0
    for k, b in base.items():
        bn = b.numpy()
        name = k[:-len(".weight")]
        if name in A0:
            Am = hfio.to_float(*st[f"base_model.model.{name}.lora_A.weight"]).astype(np.float64)
            Bm = hfio.to_float(*st[f"base_model.model.{name}.lora_B.weight"]).astype(np.float64)
            bn = bn + (ALPHA / RANK) * (Bm @ Am)
        worst = max(worst, float(np.abs(merged[k] - bn).max()))
    check(set(merged) == set(base) and worst <= 1e-6, f"merged export (max abs diff {worst:.3g})")

    # dp2 (zero 0): each rank one of the two sequences, only the adapter gradients all-reduced
    s = json.load(open(os.path.join(tmp, "lora.json")))
    s["parallel"] = {"dp": 2, "zero_stage": 0}
    s["export"] = {"lora": True}
    spd = os.path.join(tmp, "dp2.json")
    json.dump(s, open(spd, "w"))
    rund = os.path.join(tmp, "run-dp2")
    rc, out, err = worker(["--spec", spd, "--out", rund, "--nproc", "2"])
    gotd = losses(out)
    reld = max((abs(g - w) / abs(w) for g, w in zip(gotd, want)), default=1.0)
    print("dp2   :", gotd)
    check(rc == 0 and len(gotd) == STEPS and reld <= 1e-5,
          f"dp2 loss curve vs torch within 1e-5 relative (max {reld:.3g}) rc={rc} {err[-300:]}")
    if rc == 0:
        std = hfio.read_safetensors(os.path.join(rund, "export", "lora",
                                                 "adapter_model.safetensors"))
        dd = max(float(np.abs(hfio.to_float(*std[k]) - hfio.to_float(*st[k])).max()) for k in st)
        check(set(std) == set(st) and dd <= 1e-4, f"dp2 adapters match one process (max {dd:.3g})")
    # ZeRO 1 and 2 over the adapter state: the same curve, the same adapters
    for z in (1, 2):
        s["parallel"] = {"dp": 2, "zero_stage": z}
        json.dump(s, open(spd, "w"))
        runz = os.path.join(tmp, f"run-z{z}")
        rc, out, err = worker(["--spec", spd, "--out", runz, "--nproc", "2"])
        gotz = losses(out)
        relz = max((abs(g - w) / abs(w) for g, w in zip(gotz, want)), default=1.0)
        check(rc == 0 and len(gotz) == STEPS and relz <= 1e-5,
              f"dp2 zero {z} loss curve vs torch within 1e-5 relative (max {relz:.3g}) rc={rc} "
              f"{err[-300:]}")
        if rc == 0:
            stz = hfio.read_safetensors(os.path.join(runz, "export", "lora",
                                                     "adapter_model.safetensors"))
            dz = max(float(np.abs(hfio.to_float(*stz[k]) - hfio.to_float(*st[k])).max())
                     for k in st)
            check(set(stz) == set(st) and dz <= 1e-4,
                  f"dp2 zero {z} adapters match one process (max {dz:.3g})")

    # tensor and pipeline parallelism: the adapters split like their base layer (tp), each
    # stage holds its blocks' adapters (pp); the exports gather whole tensors
    merged1 = {k: hfio.to_float(*v) for k, v in
               hfio.read_model_dir(os.path.join(run, "export", "hf")).items()}
    for name, par, nproc in (("tp2", {"tp": 2}, 2), ("pp2", {"pp": 2}, 2),
                             ("tp2-pp2", {"tp": 2, "pp": 2}, 4),
                             ("tp2-dp2-z1", {"tp": 2, "dp": 2, "zero_stage": 1}, 4)):
        s["parallel"] = par
        s["export"] = {"lora": True, "hf": True}
        json.dump(s, open(spd, "w"))
        runp = os.path.join(tmp, f"run-{name}")
        rc, out, err = worker(["--spec", spd, "--out", runp, "--nproc", str(nproc)])
        gp = losses(out)
        relp = max((abs(g - w) / abs(w) for g, w in zip(gp, want)), default=1.0)
        rel1 = max((abs(g - w) / abs(w) for g, w in zip(gp, got)), default=1.0)
        print(f"{name:7s}:", gp)
        check(rc == 0 and len(gp) == STEPS and relp <= 1e-5 and rel1 <= 1e-6,
              f"{name} loss curve vs torch within 1e-5 (max {relp:.3g}) and vs one process "
              f"within 1e-6 (max {rel1:.3g}) rc={rc} {err[-300:]}")
        if rc != 0:
            continue
        if "pp" not in par:  # the planner's LoRA bytes under tp: the rank's shares exactly
            mem = [l for l in out if l.get("type") == "memory"]
            same = mem and all(abs(mem[0]["planned_gib"][k] - mem[0]["allocated_gib"][k]) * 2**30
                               < 0.5 for k in ("params", "grads", "optimizer"))
            check(same, f"{name} planner params/grads/optimizer equal the allocation: {mem[:1]}")
        stp = hfio.read_safetensors(os.path.join(runp, "export", "lora",
                                                 "adapter_model.safetensors"))
        shp = all(stp[k][1] == st[k][1] for k in st if k in stp)
        dp_ = max(float(np.abs(hfio.to_float(*stp[k]) - hfio.to_float(*st[k])).max())
                  for k in st if k in stp)
        check(set(stp) == set(st) and shp and dp_ <= 1e-5,
              f"{name} PEFT export: every adapter whole, equal to one process's (max {dp_:.3g})")
        acp = json.load(open(os.path.join(runp, "export", "lora", "adapter_config.json")))
        check(acp == acfg, f"{name} adapter_config.json equals one process's")
        mp = {k: hfio.to_float(*v) for k, v in
              hfio.read_model_dir(os.path.join(runp, "export", "hf")).items()}
        dm = max(float(np.abs(mp[k] - merged1[k]).max()) for k in merged1 if k in mp)
        check(set(mp) == set(merged1) and dm <= 1e-5,
              f"{name} merged export equals one process's (max {dm:.3g})")

    # continuing from a PEFT adapter (model.init_from = the exported directory): its first
    # loss is the reference's 11th (the adapters after 10 steps)
    want11 = reference(cfgj, base, toks, A0, STEPS + 1) if A0 else []
    spi = os.path.join(tmp, "peft-init.json")
    spec(spi, os.path.join(run, "export", "lora"), data, steps=1, lr=1e-12)
    rc, out, err = worker(["--spec", spi, "--out", os.path.join(tmp, "run-peft"),
                           "--export-lora", os.path.join(tmp, "peft-again")])
    gp = losses(out)
    check(rc == 0 and gp and want11 and abs(gp[0] - want11[-1]) <= 1e-5 * abs(want11[-1]),
          f"PEFT init_from: first loss {gp[:1]} vs reference step 11 "
          f"{want11[-1:]} rc={rc} {err[-300:]}")
    if rc == 0:
        sa = hfio.read_safetensors(os.path.join(tmp, "peft-again", "adapter_model.safetensors"))
        da = max(float(np.abs(hfio.to_float(*sa[k]) - hfio.to_float(*st[k])).max()) for k in st)
        check(set(sa) == set(st) and da <= 1e-6, f"PEFT init_from loads every adapter ({da:.3g})")
    for name, par in (("tp2", {"tp": 2}), ("pp2", {"pp": 2})):
        spit = os.path.join(tmp, f"peft-init-{name}.json")
        spec(spit, os.path.join(run, "export", "lora"), data, steps=1, lr=1e-12)
        si = json.load(open(spit))
        si["parallel"] = par
        json.dump(si, open(spit, "w"))
        rc, out, err = worker(["--spec", spit, "--out", os.path.join(tmp, f"run-peft-{name}"),
                               "--nproc", "2"])
        gp = losses(out)
        check(rc == 0 and gp and want11 and abs(gp[0] - want11[-1]) <= 1e-5 * abs(want11[-1]),
              f"PEFT init_from with {name}: first loss {gp[:1]} vs reference step 11 "
              f"{want11[-1:]} rc={rc} {err[-300:]}")
    spb = os.path.join(tmp, "peft-bad.json")
    spec(spb, os.path.join(run, "export", "lora"), data, steps=1, rank=RANK * 2)
    rc, out, _ = worker(["--spec", spb, "--out", os.path.join(tmp, "run-peft-bad")])
    check(rc == 2 and out and out[-1].get("code") == "LORA_INIT_INVALID" and
          "r=4" in out[-1].get("message", ""), f"PEFT init_from of another rank refused: {out[-1:]}")

    # dropout (PEFT: on the adapter input): step 1 equals no dropout (B = 0), later steps
    # differ; resuming from a checkpoint repeats the uninterrupted run bit for bit
    spdr = os.path.join(tmp, "dropout.json")
    spec(spdr, hf, data, dropout=0.1, export={"lora": True})
    sd = json.load(open(spdr))
    sd["checkpoint"] = {"every_steps": 5, "keep": 2}
    json.dump(sd, open(spdr, "w"))
    rc, out, err = worker(["--spec", spdr, "--out", os.path.join(tmp, "run-drop")])
    gdr = losses(out)
    check(rc == 0 and len(gdr) == STEPS and gdr[0] == got[0] and
          all(abs(a - b) > 1e-7 for a, b in zip(gdr[1:], got[1:])),
          f"dropout 0.1: step 1 equals no dropout, later steps differ: {gdr} rc={rc} {err[-300:]}")
    # full recompute re-runs the adapters with the same masks: the same bits
    sdr = json.load(open(spdr))
    sdr["train"]["recompute"] = "full"
    sprc = os.path.join(tmp, "dropout-rc.json")
    json.dump(sdr, open(sprc, "w"))
    rc, out, err = worker(["--spec", sprc, "--out", os.path.join(tmp, "run-drop-rc")])
    check(rc == 0 and losses(out) == gdr,
          f"dropout 0.1 with full recompute equals no recompute bit for bit rc={rc} {err[-200:]}")
    # dp2: each rank draws the masks of its micro-batch's place in the global batch, so the
    # curve is one process's (two micro-steps)
    sdr["train"]["recompute"] = "none"
    sdr["parallel"] = {"dp": 2, "zero_stage": 1}
    spd2 = os.path.join(tmp, "dropout-dp2.json")
    json.dump(sdr, open(spd2, "w"))
    rc, out, err = worker(["--spec", spd2, "--out", os.path.join(tmp, "run-drop-dp2"),
                           "--nproc", "2"])
    gd2 = losses(out)
    reld2 = max((abs(a - b) / abs(b) for a, b in zip(gd2, gdr)), default=1.0)
    check(rc == 0 and len(gd2) == STEPS and reld2 <= 1e-6,
          f"dropout 0.1 dp2 zero 1 follows one process within 1e-6 (max {reld2:.3g}) rc={rc} "
          f"{err[-200:]}")
    # tp2 / pp2: the masks index the whole adapter input as at tp = 1 (a row-parallel base's
    # input slice is masked in its columns of the whole width), so the curve is one process's
    for name, par in (("tp2", {"tp": 2}), ("pp2", {"pp": 2})):
        sdr["parallel"] = par
        json.dump(sdr, open(spd2, "w"))
        rc, out, err = worker(["--spec", spd2, "--out", os.path.join(tmp, f"run-drop-{name}"),
                               "--nproc", "2"])
        gdp = losses(out)
        reldp = max((abs(a - b) / abs(b) for a, b in zip(gdp, gdr)), default=1.0)
        check(rc == 0 and len(gdp) == STEPS and reldp <= 1e-6,
              f"dropout 0.1 {name} follows one process within 1e-6 (max {reldp:.3g}) rc={rc} "
              f"{err[-200:]}")
    # tp2 checkpoints: resumed at step 5, the uninterrupted tp2 run again
    sdr["parallel"] = {"tp": 2}
    sdr["checkpoint"] = {"every_steps": 5, "keep": 2}
    for steps, d in ((STEPS, "run-drop-tp2-full"), (5, "run-drop-tp2-res"),
                     (STEPS, "run-drop-tp2-res")):
        sdr["train"]["steps"] = steps
        json.dump(sdr, open(spd2, "w"))
        rc, out, err = worker(["--spec", spd2, "--out", os.path.join(tmp, d), "--nproc", "2"])
        check(rc == 0, f"tp2 dropout run of {steps} steps in {d} rc={rc} {err[-200:]}")
        if d.endswith("full"):
            gfull = losses(out)
        elif steps == 5:
            gres = losses(out)
        else:
            gres += losses(out)
    check(gres == gfull and len(gfull) == STEPS,
          f"tp2 resumed at step 5 equals the uninterrupted tp2 run: {gres} vs {gfull}")
    # its checkpoint at step 5 resumed under other layouts: every rank reads every tp share
    # and takes its own; the curve goes on as one process's
    for name, par, nproc in (("dp2-z1", {"dp": 2, "zero_stage": 1}, 2), ("pp2", {"pp": 2}, 2),
                             ("one", None, 1)):
        d = os.path.join(tmp, f"run-drop-tp2-to-{name}")
        shutil.copytree(os.path.join(tmp, "run-drop-tp2-res"), d)
        shutil.rmtree(os.path.join(d, "checkpoints", "step_00000010"))
        sdr["train"]["steps"] = STEPS
        sdr["parallel"] = par or {}
        json.dump(sdr, open(spd2, "w"))
        rc, out, err = worker(["--spec", spd2, "--out", d] +
                              (["--nproc", str(nproc)] if nproc > 1 else []))
        gr = gres[:5] + losses(out)
        relr = max((abs(a - b) / abs(b) for a, b in zip(gr, gdr)), default=1.0)
        check(rc == 0 and len(gr) == STEPS and relr <= 1e-6,
              f"tp2 checkpoint resumed under {name}: the curve follows one process within 1e-6 "
              f"(max {relr:.3g}) rc={rc} {err[-300:]}")
    # another train.lora is refused, naming both
    d = os.path.join(tmp, "run-drop-tp2-res")
    sdr["parallel"] = {"tp": 2}
    sdr["train"]["steps"] = STEPS + 2
    sdr["train"]["lora"]["rank"] = RANK * 2
    json.dump(sdr, open(spd2, "w"))
    rc, out, _ = worker(["--spec", spd2, "--out", d, "--nproc", "2"])
    msg = out[-1].get("message", "") if out else ""
    check(rc != 0 and out and out[-1].get("code") == "CHECKPOINT_INVALID" and
          f"rank {RANK}" in msg and f"rank={RANK * 2}" in msg,
          f"a LoRA checkpoint resumed with another rank refused: {out[-1:]}")
    sdr["train"]["lora"]["rank"] = RANK
    sdr["checkpoint"] = {"every_steps": 0, "keep": 1}
    sdr["train"]["steps"] = STEPS
    acd = json.load(open(os.path.join(tmp, "run-drop", "export", "lora", "adapter_config.json")))
    check(abs(acd.get("lora_dropout", 0) - 0.1) < 1e-12, "adapter_config lora_dropout 0.1")
    sd["train"]["steps"] = 5
    json.dump(sd, open(spdr, "w"))
    rres = os.path.join(tmp, "run-resume")
    rc1, out1, _ = worker(["--spec", spdr, "--out", rres])
    sd["train"]["steps"] = STEPS
    json.dump(sd, open(spdr, "w"))
    rc2, out2, err2 = worker(["--spec", spdr, "--out", rres])
    g1, g2 = losses(out1), losses(out2)
    check(rc1 == 0 and rc2 == 0 and g1 == gdr[:5] and g2 == gdr[5:],
          f"resumed at step 5 equals the uninterrupted run: {g1} + {g2} rc={rc1},{rc2} "
          f"{err2[-300:]}")
    if rc2 == 0:
        s1 = hfio.read_safetensors(os.path.join(tmp, "run-drop", "export", "lora",
                                                "adapter_model.safetensors"))
        s2 = hfio.read_safetensors(os.path.join(rres, "export", "lora",
                                                "adapter_model.safetensors"))
        check(all(np.array_equal(hfio.to_float(*s1[k]), hfio.to_float(*s2[k])) for k in s1),
              "resumed adapters equal the uninterrupted run's bit for bit")
    spfr = os.path.join(tmp, "full-resume.json")
    spec(spfr, hf, data, lora=False, steps=6)
    rc, out, _ = worker(["--spec", spfr, "--out", rres])
    check(rc != 0 and out and "LoRA adapter checkpoint" in out[-1].get("message", ""),
          f"a full fine-tune refuses a LoRA run directory: {out[-1:]}")

    # refusals
    sp = os.path.join(tmp, "bad.json")
    s = json.load(open(os.path.join(tmp, "lora.json")))
    s["parallel"] = {"dp": 2, "zero_stage": 3}
    json.dump(s, open(sp, "w"))
    rc, out, _ = worker(["--spec", sp, "--out", os.path.join(tmp, "bad2"), "--world", "2",
                         "--rank", "0", "--rdzv", "file:" + os.path.join(tmp, "rdzv")])
    check(rc == 2 and out and out[-1].get("code") == "LORA_UNSUPPORTED" and
          "zero_stage=3" in out[-1].get("message", ""), f"zero_stage=3 refused: {out[-1:]}")
    spf2 = os.path.join(tmp, "full2.json")
    spec(spf2, hf, data, lora=False, steps=1)
    rc, out, _ = worker(["--spec", spf2, "--out", os.path.join(tmp, "bad3"), "--export-lora",
                         os.path.join(tmp, "x")])
    check(rc == 2 and out and out[-1].get("code") == "LORA_UNSUPPORTED",
          f"--export-lora without train.lora refused: {out[-1:]}")
    rc, out, _ = worker(["--spec", os.path.join(tmp, "lora.json"), "--out", run, "--export-hf",
                         os.path.join(tmp, "y")])
    check(rc == 2 and out and out[-1].get("code") == "LORA_UNSUPPORTED" and
          not os.path.exists(os.path.join(tmp, "y")),
          f"--export-hf from a LoRA run's checkpoint refused: {out[-1:]}")
    gpt2_part(tmp)
    print("failures:", failures)
    if not failures:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
