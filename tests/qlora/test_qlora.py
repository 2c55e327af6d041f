"""QLoRA (train.quantize_base "nf4") against independent numpy / torch references.

  test_qlora.py LOOM_WORKER NF4_TOOL

1. NF4 round trip. The reference here builds the NF4 table from the QLoRA paper's
   definition (normal quantiles of evenly spaced probabilities, 8 positive and 7
   negative, with an exact 0, offset 1/2 (1/32 + 1/30) from the tails, scaled to [-1, 1])
   and bitsandbytes' signed 8-bit dynamic map, and quantizes in numpy: 64-weight blocks
   by absmax, nearest code, then the absmax values less their mean in 256-blocks by
   absmax onto the 8-bit map. Loom's quantizer (nf4_tool: worker/nf4.c) must give the
   same table, codes, absmax codes, scales, offset and dequantized values. The error
   against bf16 on N(0, 1) weights is printed (docs/engine.md "QLoRA" quotes it).
2. A tiny HF-layout llama trained 10 steps with train.lora and quantize_base nf4 by the
   real loom-worker on cpu: its loss curve equals a torch float64 reference (llama
   forward of tests/hf/ref_forward.py, LoRA, AdamW with clipping) run over the base with
   its block linear weights quantized and dequantized by the numpy reference, within
   1e-5 relative; the planner's params equal the allocated params; the tp2 refusal
   (d_ff 96: down_proj's 48 columns a rank would split a 64-weight block; dp, pp, tp and
   the merged export: tests/lora/test_qlora_par.py).
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from statistics import NormalDist

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf"))
import hfio  # noqa: E402
import make_tiny_hf  # noqa: E402
import ref_forward  # noqa: E402

WORKER, TOOL = sys.argv[1], sys.argv[2]
failures = 0
SEQ, STEPS, RANK, ALPHA, LR, WD, CLIP = 32, 10, 4, 8.0, 3e-3, 0.01, 1.0
MODULE = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
          "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
          "down": "mlp.down_proj"}
TARGETS = list(MODULE)


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, file=sys.stderr)
    else:
        print("ok:", what)


# ---- the reference quantizer ----

def nf4_table():
    """QLoRA's NF4: quantiles of N(0, 1) at evenly spaced probabilities."""
    nd = NormalDist()
    delta = 0.5 * (1 / 32 + 1 / 30)
    pos = [nd.inv_cdf(p) for p in np.linspace(1 - delta, 0.5, 9)[:-1]]
    neg = [-nd.inv_cdf(p) for p in np.linspace(1 - delta, 0.5, 8)[:-1]]
    v = np.array(sorted(pos + neg + [0.0]))
    return (v / v.max()).astype(np.float32)


def dynamic_map():
    """bitsandbytes' signed dynamic 8-bit map: for exponent i < 7, +-10^(i-6) times the
    midpoints of 2^i + 1 evenly spaced points in [0.1, 1]; then 0 and 1."""
    v = []
    for i in range(7):
        b = np.linspace(0.1, 1.0, 2 ** i + 1)
        mids = (b[:-1] + b[1:]) / 2
        v += list(10.0 ** (i - 6) * mids) + list(-(10.0 ** (i - 6)) * mids)
    v += [0.0, 1.0]
    assert len(v) == 256
    return np.array(sorted(v)).astype(np.float32)


def nearest(tab, x):
    """Index of the nearest table value (ties to the lower index)."""
    d = np.abs(x[:, None].astype(np.float64) - tab[None, :].astype(np.float64))
    return np.argmin(d, axis=1)


def nearest32(tab, x):
    """nearest() with float32 distances (the quantizer's rule where a value sits within a
    rounding of a midpoint; ties to the lower index)."""
    d = np.abs(x[:, None].astype(np.float32) - tab[None, :].astype(np.float32))
    return np.argmin(d, axis=1)


def quantize(w, code, dmap, near=nearest):
    n = w.size
    nb = (n + 63) // 64
    pad = np.zeros(nb * 64, np.float32)
    pad[:n] = w
    blocks = pad.reshape(nb, 64)
    absmax = np.abs(blocks).max(axis=1).astype(np.float32)
    inv = np.where(absmax > 0, np.float32(1) / np.where(absmax > 0, absmax, 1), 0)
    inv = inv.astype(np.float32)
    x = (blocks * inv[:, None]).astype(np.float32).reshape(-1)[:n]
    codes = near(code, x)
    offset = np.float32(absmax.astype(np.float64).mean())
    nb2 = (nb + 255) // 256
    cen = (absmax - offset).astype(np.float32)
    cpad = np.zeros(nb2 * 256, np.float32)
    cpad[:nb] = cen
    scale = np.abs(cpad.reshape(nb2, 256)).max(axis=1).astype(np.float32)
    sinv = np.where(scale > 0, np.float32(1) / np.where(scale > 0, scale, 1), 0)
    sinv = sinv.astype(np.float32)
    y = (cen * np.repeat(sinv, 256)[:nb]).astype(np.float32)
    q8 = nearest(dmap, y)
    return codes, q8, scale, offset


def dequantize(codes, q8, scale, offset, code, dmap):
    # absmax in float64 then float32: the fused multiply-add's single rounding
    a = (dmap[q8].astype(np.float64) * np.repeat(scale, 256)[:q8.size].astype(np.float64) +
         np.float64(offset)).astype(np.float32)
    return (code[codes] * np.repeat(a, 64)[:codes.size]).astype(np.float32)


def loom_quantize(tmp, w, threads=None):
    """Loom's buffer and dequantized values for w (nf4_tool; threads: the fast quantizer on
    that many threads, 0 the serial reference, None the default)."""
    src, oq, ow = (os.path.join(tmp, f) for f in ("w.bin", "q.bin", "d.bin"))
    w.astype("<f4").tofile(src)
    p = subprocess.run([TOOL, src, oq, ow] + ([] if threads is None else [str(threads)]),
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None
    n = w.size
    q = np.fromfile(oq, np.uint8)
    nb, nb2 = (n + 63) // 64, ((n + 63) // 64 + 255) // 256
    o_q8 = (n + 1) // 2
    o_sc = (o_q8 + nb + 3) // 4 * 4
    packed = q[:o_q8]
    codes = np.empty(2 * o_q8, np.int64)
    codes[0::2], codes[1::2] = packed >> 4, packed & 15
    return {"codes": codes[:n], "q8": q[o_q8:o_q8 + nb].astype(np.int64),
            "scale": q[o_sc:o_sc + 4 * nb2].view("<f4"),
            "offset": q[o_sc + 4 * nb2:o_sc + 4 * nb2 + 4].view("<f4")[0],
            "map": q[o_sc + 4 * nb2 + 4:o_sc + 4 * nb2 + 4 + 1024].view("<f4"),
            "deq": np.fromfile(ow, "<f4"), "bytes": q.size}


def round_trip(tmp):
    code, dmap = nf4_table(), dynamic_map()
    # the table: one block whose absmax is exactly 1 (one block: offset 1, scale 0), each
    # reference value four times: Loom dequantizes them to its table values
    t = np.tile(code, 4).astype(np.float32)
    lq = loom_quantize(tmp, t)
    check(lq is not None, "nf4_tool runs")
    if lq is None:
        return
    got = lq["deq"]
    table = got[:16].copy()  # Loom's float32 table, checked against the definition here
    check(np.array_equal(lq["codes"], np.tile(np.arange(16), 4)) and
          np.abs(got - t).max() <= 1e-6,
          f"NF4 table equals the paper's definition (max diff {np.abs(got - t).max():.2g})")
    check(np.abs(lq["map"] - dmap).max() <= 1e-7 * 1.0 and np.all(np.diff(lq["map"]) > 0),
          "the 8-bit map equals bitsandbytes' dynamic map")

    rng = np.random.default_rng(11)
    n = 64 * 256 * 3 + 64 * 5 + 37  # 3 full 256-block groups, a partial one, a partial block
    w = rng.standard_normal(n).astype(np.float32) * 0.02
    w[64:128] = 0.0  # an all-zero block
    w[128:192] = 0.5  # a constant block far above the rest
    lq = loom_quantize(tmp, w)
    codes, q8, scale, offset = quantize(w, code, dmap)
    want = dequantize(codes, q8, scale, offset, code, dmap)
    nb = (n + 63) // 64
    ok_size = lq["bytes"] == ((n + 1) // 2 + nb + 3) // 4 * 4 + 4 * ((nb + 255) // 256) + 4 + 1024
    check(ok_size, f"buffer of {lq['bytes']} bytes for {n} weights (format of nf4_format.h)")
    dc = int((lq["codes"] != codes).sum())
    dq = int((lq["q8"] != q8).sum())
    check(dc == 0 and dq == 0,
          f"codes and absmax codes equal numpy's ({dc} of {n}, {dq} of {q8.size} differ)")
    check(np.array_equal(lq["scale"], scale) and lq["offset"] == offset,
          f"scales and offset equal numpy's (offset {lq['offset']} vs {offset})")
    dd = float(np.abs(lq["deq"] - want).max())
    check(dd <= 1e-6 * float(np.abs(w).max()),
          f"dequantized values equal numpy's (max diff {dd:.3g})")
    check(np.all(lq["deq"][64:128] == 0), "an all-zero block stays zero")
    # the serial reference and the fast quantizer on 1, 2 and 7 threads: numpy's codes,
    # absmax codes, scales and offset each, and one buffer between them; plus values at the
    # midpoints of the table (blocks with absmax 1), where the nearest code is decided by
    # float32 distances (nearest32) to Loom's float32 table (checked above within 1.8e-7 of the
    # definition: a midpoint moves by as much, so the rounding is checked on that table)
    ties = rng.uniform(-1, 1, 64 * 30).astype(np.float32)
    mids = ((table[:-1].astype(np.float64) + table[1:]) / 2).astype(np.float32)
    ties[1:1 + 15 * 3] = np.concatenate([np.nextafter(mids, -2), mids, np.nextafter(mids, 2)])
    ties[::64] = 1.0
    for name, v, near, tab in (("normal", w, nearest, code), ("midpoints", ties, nearest32, table)):
        codes, q8, scale, offset = quantize(v, tab, dmap, near)
        bufs = []
        for th in (0, 1, 2, 7):
            lq = loom_quantize(tmp, v, th)
            if lq is None:
                check(False, f"nf4_tool runs with {th} threads")
                continue
            bufs.append(np.fromfile(os.path.join(tmp, "q.bin"), np.uint8))
            dc, dq = int((lq["codes"] != codes).sum()), int((lq["q8"] != q8).sum())
            check(dc == 0 and dq == 0 and np.array_equal(lq["scale"], scale) and
                  lq["offset"] == offset,
                  f"{name}: {th or 'serial'} thread(s): codes, absmax codes, scales and offset "
                  f"equal numpy's ({dc}, {dq} differ)")
        check(len(bufs) == 4 and all(np.array_equal(b, bufs[0]) for b in bufs),
              f"{name}: the same buffer on the serial path and 1, 2, 7 threads")

    # the error against bf16 (normal weights, the case NF4 is built for)
    g = rng.standard_normal(1 << 20).astype(np.float32)
    lq = loom_quantize(tmp, g)
    bf = hfio.bf16_bits_to_f32(hfio.f32_to_bf16_bits(g))
    rms = float(np.sqrt((g.astype(np.float64) ** 2).mean()))
    e_nf4 = float(np.sqrt(((lq["deq"] - g).astype(np.float64) ** 2).mean())) / rms
    e_bf16 = float(np.sqrt(((bf - g).astype(np.float64) ** 2).mean())) / rms
    e_rel = float(np.abs(lq["deq"] - g).max() / np.abs(g).max())
    print(f"error on N(0,1) weights, relative RMS: nf4 {e_nf4:.4f}, bf16 {e_bf16:.5f}; "
          f"nf4 max |error| / max |w| {e_rel:.4f}; {lq['bytes'] / g.size:.4f} bytes a weight")
    check(0.05 < e_nf4 < 0.12 and e_bf16 < 0.003,
          f"NF4 error {e_nf4:.4f} (relative RMS) in the expected range, bf16 {e_bf16:.5f}")


# ---- the QLoRA run ----

def worker(args):
    p = subprocess.run([WORKER, "--log-level", "info", "--threads", "1"] + args,
                       capture_output=True, text=True, errors="replace", timeout=300)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    return p.returncode, lines, p.stderr


def losses(out):
    return [l["loss"] for l in out if l.get("type") == "step"]


def spec(path, init, data, steps=STEPS, lr=LR, quant="nf4", export=None, parallel=None):
    s = {"name": "qlora-test", "model": {"init_from": init, "seq_len": SEQ},
         "data": {"train": f"{data}/train_*.bin"},
         "train": {"steps": steps, "global_batch_tokens": 2 * SEQ, "micro_batch": 1, "lr": lr,
                   "warmup_steps": 0, "schedule": "constant", "seed": 5, "weight_decay": WD,
                   "grad_clip": CLIP, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
                   "lora": {"rank": RANK, "alpha": ALPHA, "dropout": 0.0, "targets": TARGETS}},
         "checkpoint": {"every_steps": 0, "keep": 1}, "resources": {"device": "cpu"}}
    if quant:
        s["train"]["quantize_base"] = quant
    if export:
        s["export"] = export
    if parallel:
        s["parallel"] = parallel
    json.dump(s, open(path, "w"))


def reference(cfg, base, toks, A0):
    """STEPS steps of LoRA + AdamW in float64 over `base`; the losses."""
    D = torch.float64
    scale = ALPHA / RANK
    A = {n: torch.tensor(a, dtype=D, requires_grad=True) for n, a in A0.items()}
    B = {n: torch.zeros((base[n + ".weight"].shape[0], RANK), dtype=D, requires_grad=True)
         for n in A0}
    params = list(A.values()) + list(B.values())
    state = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for p in params}
    seqs = [toks[0:SEQ + 1], toks[SEQ:2 * SEQ + 1]]
    out = []
    for step in range(1, STEPS + 1):
        w = dict(base)
        for n in A:
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


def qlora_run(tmp):
    hf = os.path.join(tmp, "llama")
    rng = np.random.default_rng(78)
    cfg = make_tiny_hf.config("LlamaForCausalLM", "F32", False,
                              {"rope_theta": 10000.0, "rms_norm_eps": 1e-5})
    make_tiny_hf.write_dir(hf, cfg, make_tiny_hf.tensors("LlamaForCausalLM", False, rng),
                           "F32", 1)
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    n = 2 * SEQ + 1
    toks = [(i * 7919 + i * i * 31) % make_tiny_hf.V for i in range(n)]
    with open(os.path.join(data, "train_000.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *toks))

    # the initial adapters: one step at lr ~0
    sp = os.path.join(tmp, "init.json")
    spec(sp, hf, data, steps=1, lr=1e-12)
    rc, out, err = worker(["--spec", sp, "--out", os.path.join(tmp, "run0"), "--export-lora",
                           os.path.join(tmp, "init")])
    check(rc == 0, f"initial QLoRA run rc={rc} {err[-600:]}")
    if rc != 0:
        return
    check("qlora:" in err and "NF4" in err, "the worker logs the NF4 base")
    mem = [l for l in out if l.get("type") == "memory"]
    check(mem and abs(mem[0]["planned_gib"]["params"] - mem[0]["allocated_gib"]["params"]) <=
          1e-12, f"planner params equal the allocated params (NF4 base) {mem[:1]}")
    init = hfio.read_safetensors(os.path.join(tmp, "init", "adapter_model.safetensors"))
    # the same spec without quantize_base: step 1 differs (the base is quantized)
    spl = os.path.join(tmp, "lora.json")
    spec(spl, hf, data, steps=1, lr=1e-12, quant=None)
    rcl, outl, _ = worker(["--spec", spl, "--out", os.path.join(tmp, "runl")])
    l1q, l1 = losses(out)[:1], losses(outl)[:1]
    check(rcl == 0 and l1q and l1 and abs(l1q[0] - l1[0]) > 1e-6 * abs(l1[0]) and
          abs(l1q[0] - l1[0]) < 0.05 * abs(l1[0]),
          f"step-1 loss of the NF4 base near, not equal to, the fp32 base's: {l1q} vs {l1}")

    sp = os.path.join(tmp, "qlora.json")
    spec(sp, hf, data, export={"lora": True})
    rc, out, err = worker(["--spec", sp, "--out", os.path.join(tmp, "run")])
    check(rc == 0, f"QLoRA run rc={rc} {err[-600:]}")
    got = losses(out)

    cfgj, base = ref_forward.load(hf)
    code, dmap = nf4_table(), dynamic_map()
    qbase = dict(base)
    for k, v in base.items():  # the block linear weights through the numpy quantizer
        if k.startswith("model.layers.") and k.endswith("_proj.weight"):
            w = v.numpy().astype(np.float32).reshape(-1)
            deq = dequantize(*quantize(w, code, dmap), code, dmap)
            qbase[k] = torch.tensor(deq.reshape(v.shape), dtype=torch.float64)
    A0 = {}
    for t in TARGETS:
        for layer in range(cfg["num_hidden_layers"]):
            name = f"model.layers.{layer}.{MODULE[t]}"
            key = f"base_model.model.{name}.lora_A.weight"
            if key in init:
                A0[name] = hfio.to_float(*init[key])
    check(len(A0) == len(TARGETS) * cfg["num_hidden_layers"], f"initial A of {len(A0)} adapters")
    want = reference(cfgj, qbase, toks, A0)
    rel = max((abs(g - w) / abs(w) for g, w in zip(got, want)), default=1.0)
    print("loom  :", got)
    print("torch :", want)
    check(len(got) == STEPS and len(want) == STEPS and rel <= 1e-5,
          f"10-step QLoRA loss curve vs torch over the dequantized base within 1e-5 relative "
          f"(max {rel:.3g})")
    check(len(got) == STEPS and got[-1] < got[0] - 1e-3, "the loss goes down")
    check(os.path.exists(os.path.join(tmp, "run", "export", "lora", "adapter_model.safetensors")),
          "the adapter is exported (export.lora)")

    # refusals: tp2 over this model's d_ff 96 (a 64-weight block on two ranks; dp, pp, tp and the
    # merged export: tests/lora/test_qlora_par.py)
    for what, kw, extra in (("tp=2", {"parallel": {"tp": 2}}, ["--nproc", "2"]),):
        spr = os.path.join(tmp, "refuse.json")
        spec(spr, hf, data, steps=1, **kw)
        run = os.path.join(tmp, "run-refused-" + what)
        rc, out, err = worker(["--spec", spr, "--out", run] + extra)
        # the error line (with several processes the launcher may stop before a rank's line
        # reaches stdout: then the rank's log line on stderr)
        errs = [l for l in out if l.get("type") == "error"]
        coded = (errs[0].get("code") == "LORA_UNSUPPORTED") if errs else \
            "LORA_UNSUPPORTED: train.quantize_base nf4" in err
        check(rc != 0 and coded,
              f"quantize_base nf4 with {what} refused: rc={rc} {errs[:1]} {err[-200:]}")


def main():
    tmp = tempfile.mkdtemp(prefix="loom-qlora-")
    try:
        round_trip(tmp)
        qlora_run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("failures:", failures)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
