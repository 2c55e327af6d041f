"""Loss normalisation by counted tokens, through the real loom-worker (cpu): with loss masks,
a step's loss and gradient are the mean over the counted targets of the whole step (every
micro-batch), not a mean of per-micro-batch means and not the sum over the step's token count.

  test_loss_norm.py LOOM_WORKER

The model is a random tiny Llama in the Hugging Face layout (tests/hf/make_tiny_hf.py). One
shard holds exactly two windows of seq_len + 1 tokens; a step of global_batch_tokens = 2 x
seq_len with micro_batch 1 reads both, one per micro-batch (grad_accum 2). The masks count 1
target in one window and 14 in the other. The reference is a float64 torch forward of the HF
architecture (tests/hf/ref_forward.py, written from the architecture's math) with autograd:
loss = sum of the counted targets' cross-entropies / 15, and the norm of its gradient over
every weight. The worker's step record must match both (1e-4 relative), and must differ from
what the two wrong normalisations give, so the test tells them apart. Without masks the same
comparison (mean over all 2 x seq_len targets) checks the reference itself.
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
T = 16
failures = 0


def check(cond, what):
    global failures
    print(("ok: " if cond else "FAIL: ") + what, file=sys.stderr)
    if not cond:
        failures += 1


def run(spec_path, out):
    p = subprocess.run([WORKER, "--threads", "1", "--spec", spec_path, "--out", out,
                        "--no-save"], capture_output=True, text=True, errors="replace",
                       timeout=300)
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    steps = [l for l in lines if l.get("type") == "step"]
    return p.returncode, (steps[0] if steps else None), p.stderr


def reference(init, windows, masks, mode):
    """Loss and gradient norm in float64. mode: 'counted' (the sum over every counted target
    of the step / their number), 'per_micro' (the mean of each window's mean), 'global' (the
    sum / the step's token count)."""
    cfg, w = ref_forward.load(init)
    for t in w.values():
        t.requires_grad_(True)
    sums, counts = [], []
    for toks, mask in zip(windows, masks):
        lp = torch.log_softmax(ref_forward.logits(cfg, w, toks[:-1]), dim=-1)
        tg = torch.tensor(toks[1:])
        nll = -lp[torch.arange(len(tg)), tg]
        keep = torch.tensor([float(m) for m in mask[1:]], dtype=ref_forward.D)
        sums.append((nll * keep).sum())
        counts.append(sum(mask[1:]))
    total = sum(counts)
    if mode == "counted":
        loss = (sums[0] + sums[1]) / total
    elif mode == "per_micro":
        loss = (sums[0] / counts[0] + sums[1] / counts[1]) / 2
    else:
        loss = (sums[0] + sums[1]) / (2 * T)
    loss.backward()
    norm = torch.sqrt(sum((t.grad ** 2).sum() for t in w.values())).item()
    mean = ((sums[0] + sums[1]) / total).item()
    return mean, norm, total


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    tmp = tempfile.mkdtemp(prefix="loss_norm.")
    good = os.path.join(tmp, "good")
    make_tiny_hf.make_good(good)
    init = os.path.join(good, "llama")
    toks = [(i * 7919 + i * i * 31 + 5) % make_tiny_hf.V for i in range(2 * T + 1)]
    windows = [toks[0:T + 1], toks[T:2 * T + 1]]
    # window 0 counts 1 target, window 1 counts 14 (index 0 of a window is never a target)
    m0 = [0] * (T + 1)
    m0[7] = 1
    m1 = [0] * (T + 1)
    for i in range(2, 16):
        m1[i] = 1
    mask = m0[:T] + m1  # the shard's mask; token T is window 0's last target and window 1's first
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    with open(os.path.join(data, "train_000.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks))
    spec = {"name": "loss-norm", "model": {"init_from": init, "seq_len": T},
            "data": {"train": f"{data}/train_*.bin"},
            "train": {"steps": 1, "global_batch_tokens": 2 * T, "micro_batch": 1, "lr": 1e-4,
                      "warmup_steps": 0, "seed": 5, "grad_clip": 0},
            "resources": {"device": "cpu"}}
    sp = os.path.join(tmp, "spec.json")
    json.dump(spec, open(sp, "w"))

    # no mask: every target counts; checks the reference against the worker's fixed scale
    ones = [[1] * (T + 1)] * 2
    full_loss, full_norm, _ = reference(init, windows, ones, "counted")
    rc, st, err = run(sp, os.path.join(tmp, "run-all"))
    check(rc == 0 and st is not None, f"no mask: trains (exit {rc}) {err[-400:] if rc else ''}")
    if st:
        check(rel(st["loss"], full_loss) < 1e-4,
              f"no mask: loss {st['loss']:.7f} vs torch {full_loss:.7f}")
        check(rel(st["grad_norm"], full_norm) < 1e-4,
              f"no mask: grad_norm {st['grad_norm']:.7f} vs torch {full_norm:.7f}")

    with open(os.path.join(data, "train_000.mask"), "wb") as f:
        f.write(struct.pack("<256i", 20240521, 1, len(mask), *([0] * 253)))
        f.write(bytes(mask))
    masks = [mask[0:T + 1], mask[T:2 * T + 1]]
    loss, norm, total = reference(init, windows, masks, "counted")
    _, norm_micro, _ = reference(init, windows, masks, "per_micro")
    _, norm_global, _ = reference(init, windows, masks, "global")
    check(total == 15, f"the masks count {total} targets (1 + 14)")
    rc, st, err = run(sp, os.path.join(tmp, "run-mask"))
    check(rc == 0 and st is not None, f"mask: trains (exit {rc}) {err[-400:] if rc else ''}")
    if st:
        check(st.get("loss_tokens") == total, f"mask: loss_tokens {st.get('loss_tokens')}")
        check(rel(st["loss"], loss) < 1e-4, f"mask: loss {st['loss']:.7f} vs torch {loss:.7f}")
        check(rel(st["grad_norm"], norm) < 1e-4,
              f"mask: grad_norm {st['grad_norm']:.7f} vs torch {norm:.7f} (mean over the "
              f"step's {total} counted targets)")
        check(rel(st["grad_norm"], norm_micro) > 1e-2 and rel(st["grad_norm"], norm_global) > 1e-2,
              f"mask: not the mean of per-micro-batch means ({norm_micro:.7f}) nor the sum over "
              f"{2 * T} tokens ({norm_global:.7f})")
    subprocess.run(["rm", "-rf", tmp])
    print(f"{'FAIL' if failures else 'PASS'}: {failures} failure(s)", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
