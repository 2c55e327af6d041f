"""train.packing "document" through the real loom-worker (cpu): documents packed in one window
attend only within themselves and their positions restart at 0, so the packed step equals the
documents run one by one.

  test_packing.py LOOM_WORKER [cpu|cuda]

Random tiny models in the Hugging Face layout (tests/hf/make_tiny_hf.py): a Llama (RoPE) and a
GPT-2 (learned positions, tied head). One shard holds exactly one window of seq_len + 1 tokens
made of three documents, each ending with the EOS id that meta.json beside the shard names
(as `loom-data prepare --tokenizer` writes it). The reference is a float64 torch forward of the
HF architecture (tests/hf/ref_forward.py) with autograd, run on every document separately
(its own positions from 0, its own causal attention): loss = the sum of the cross-entropies of
all seq_len targets / seq_len (a document's EOS predicts the next document's first token from
its own document alone), and the norm of the gradient. The worker's step record must match
(1e-4 relative); with packing "concat" the worker must instead match the whole window run as
one sequence (which checks the reference) and differ from the per-document result. Bad input:
shards without meta.json are refused naming it.

With `cuda` the same runs go to the CUDA backend (bf16; documents through k_attn.cu's document
mask, RoPE and learned positions at positions within documents): the Llama window is 64 tokens
(the kernels' T % 64), the bounds are bf16's (loss 2e-2, gradient norm 5e-2 relative), and the
document run must be nearer the per-document reference than the one-sequence one.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
HF = os.path.join(os.path.dirname(HERE), "hf")
sys.path.insert(0, HF)
import make_tiny_hf  # noqa: E402
import ref_forward  # noqa: E402

WORKER = sys.argv[1]
DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cpu"
CUDA = DEVICE == "cuda"
TOL_LOSS, TOL_NORM = (2e-2, 5e-2) if CUDA else (1e-4, 1e-4)
EOS = make_tiny_hf.V - 1
failures = 0


def check(cond, what):
    global failures
    print(("ok: " if cond else "FAIL: ") + what, file=sys.stderr)
    if not cond:
        failures += 1


def run(spec_path, out):
    p = subprocess.run([WORKER, "--threads", "2", "--spec", spec_path, "--out", out,
                        "--no-save"], capture_output=True, text=True, errors="replace",
                       timeout=300)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    steps = [l for l in lines if l.get("type") == "step"]
    return p.returncode, (steps[0] if steps else None), p.stdout + p.stderr


def reference(init, toks, per_document):
    T = len(toks) - 1
    """(loss, grad norm) of the window's T targets, float64."""
    cfg, w = ref_forward.load(init)
    for t in w.values():
        t.requires_grad_(True)
    inputs = toks[:T]
    spans, s = [], 0
    if per_document:
        for i in range(T):
            if inputs[i] == EOS:
                spans.append((s, i + 1))
                s = i + 1
    if s < T:
        spans.append((s, T))
    total = 0
    for a, b in spans:
        lp = torch.log_softmax(ref_forward.logits(cfg, w, inputs[a:b]), dim=-1)
        tg = torch.tensor(toks[a + 1:b + 1])
        total = total - lp[torch.arange(b - a), tg].sum()
    loss = total / T
    loss.backward()
    norm = torch.sqrt(sum((t.grad ** 2).sum() for t in w.values())).item()
    return loss.item(), norm, len(spans)


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    tmp = tempfile.mkdtemp(prefix="packing.")
    good = os.path.join(tmp, "good")
    make_tiny_hf.make_good(good)
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    meta = os.path.join(data, "meta.json")
    # seq_len: GPT-2 keeps its 128 learned positions
    for name, T in (("llama", 64 if CUDA else 32), ("gpt2", make_tiny_hf.POS)):
        init = os.path.join(good, name)
        toks = [(i * 7919 + i * i * 31 + 5) % (make_tiny_hf.V - 1) for i in range(T + 1)]
        for i in (T // 3 - 1, 2 * T // 3):  # three documents
            toks[i] = EOS
        with open(os.path.join(data, "train_000.bin"), "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, T + 1, *([0] * 253)))
            f.write(struct.pack(f"<{T + 1}H", *toks))
        with open(meta, "w") as f:
            json.dump({"eos_token": EOS, "vocab_size": make_tiny_hf.V}, f)
        spec = {"name": "packing", "model": {"init_from": init, "seq_len": T},
                "data": {"train": f"{data}/train_*.bin"},
                "train": {"steps": 1, "global_batch_tokens": T, "micro_batch": 1, "lr": 1e-4,
                          "warmup_steps": 0, "seed": 2, "grad_clip": 0,
                          "packing": "document"},
                "resources": {"device": DEVICE}}
        sp = os.path.join(tmp, f"{name}.json")
        json.dump(spec, open(sp, "w"))
        doc_loss, doc_norm, ndocs = reference(init, toks, True)
        one_loss, one_norm, _ = reference(init, toks, False)
        check(ndocs == 3, f"{name}: the window holds {ndocs} documents")
        rc, st, out = run(sp, os.path.join(tmp, f"run-{name}-doc"))
        check(rc == 0 and st is not None, f"{name} document: trains (exit {rc}) "
              f"{out[-400:] if rc else ''}")
        if st:
            check(rel(st["loss"], doc_loss) < TOL_LOSS,
                  f"{name} document: loss {st['loss']:.7f} vs torch per document {doc_loss:.7f}")
            check(rel(st["grad_norm"], doc_norm) < TOL_NORM,
                  f"{name} document: grad_norm {st['grad_norm']:.7f} vs torch {doc_norm:.7f}")
            if CUDA:  # loss and gradient norm together
                d_doc = rel(st["loss"], doc_loss) + rel(st["grad_norm"], doc_norm)
                d_one = rel(st["loss"], one_loss) + rel(st["grad_norm"], one_norm)
                check(d_doc < d_one, f"{name} document: nearer per document (loss {doc_loss:.7f}, "
                      f"norm {doc_norm:.7f}: {d_doc:.2e}) than one sequence (loss "
                      f"{one_loss:.7f}, norm {one_norm:.7f}: {d_one:.2e})")
            else:
                check(rel(st["loss"], one_loss) > 1e-3,
                      f"{name} document: differs from one sequence ({one_loss:.7f})")
        spec["train"]["packing"] = "concat"
        json.dump(spec, open(sp, "w"))
        rc, st, out = run(sp, os.path.join(tmp, f"run-{name}-concat"))
        check(rc == 0 and st is not None, f"{name} concat: trains (exit {rc})")
        if st:
            check(rel(st["loss"], one_loss) < TOL_LOSS
                  and rel(st["grad_norm"], one_norm) < TOL_NORM,
                  f"{name} concat: loss {st['loss']:.7f} / grad_norm {st['grad_norm']:.7f} vs "
                  f"torch one sequence {one_loss:.7f} / {one_norm:.7f}")
    # where documents end must be known
    os.remove(meta)
    spec["train"]["packing"] = "document"
    json.dump(spec, open(sp, "w"))
    rc, st, out = run(sp, os.path.join(tmp, "run-nometa"))
    check(rc == 2 and st is None and "meta.json" in out and "DATA_INVALID" in out,
          f"no meta.json: exit {rc}")
    subprocess.run(["rm", "-rf", tmp])
    print(f"{'FAIL' if failures else 'PASS'}: packing {DEVICE}, {failures} failure(s)",
          file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
