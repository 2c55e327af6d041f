"""Loss masks through the real loom-worker (cpu): the first step's loss with a .mask
shard equals an independent torch reference cross-entropy over the unmasked target
positions only, and without the mask over all of them.

  test_masked_loss.py LOOM_WORKER

The model is a random tiny Llama in the Hugging Face layout (tests/hf/make_tiny_hf.py), the
reference is tests/hf/ref_forward.py (float64 torch, written from the architecture's math).
One shard holds exactly one window of seq_len + 1 tokens and a step reads one window, so the
step's batch is known. The .mask file is written here from its documented layout (a 256 int32
header: magic 20240521, version 1, token count; then one byte per token).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
HF = os.path.join(os.path.dirname(HERE), "hf")
sys.path.insert(0, HF)
import make_tiny_hf  # noqa: E402

WORKER = sys.argv[1]
T = 64
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


def main():
    tmp = tempfile.mkdtemp(prefix="masked_loss.")
    good = os.path.join(tmp, "good")
    make_tiny_hf.make_good(good)
    init = os.path.join(good, "llama")
    toks = [(i * 7919 + i * i * 31 + 5) % make_tiny_hf.V for i in range(T + 1)]
    # a pattern with runs of both kinds, token 0 (never a target) masked too
    mask = [0 if (i % 7 in (0, 1, 2) or i < 5) else 1 for i in range(T + 1)]
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    with open(os.path.join(data, "train_000.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, T + 1, *([0] * 253)))
        f.write(struct.pack(f"<{T + 1}H", *toks))
    spec = {"name": "masked", "model": {"init_from": init, "seq_len": T},
            "data": {"train": f"{data}/train_*.bin"},
            "train": {"steps": 1, "global_batch_tokens": T, "micro_batch": 1, "lr": 0.001,
                      "warmup_steps": 0, "seed": 3},
            "resources": {"device": "cpu"}}
    sp = os.path.join(tmp, "spec.json")
    json.dump(spec, open(sp, "w"))

    ref = json.loads(subprocess.run(
        [sys.executable, os.path.join(HF, "ref_forward.py"), init, ",".join(map(str, toks)), "0"],
        capture_output=True, text=True, check=True).stdout)["logprobs"]
    full = -sum(ref[1:]) / T
    kept = [i for i in range(1, T + 1) if mask[i]]
    masked = -sum(ref[i] for i in kept) / len(kept)

    rc, st, err = run(sp, os.path.join(tmp, "run-all"))
    check(rc == 0 and st is not None, f"no mask: trains (exit {rc}) {err[-400:] if rc else ''}")
    if st:
        check(abs(st["loss"] - full) <= 1e-4 * abs(full),
              f"no mask: loss {st['loss']:.7f} vs torch {full:.7f} over all {T} targets")
        check(st.get("loss_tokens") == T, f"no mask: loss_tokens {st.get('loss_tokens')} == {T}")

    with open(os.path.join(data, "train_000.mask"), "wb") as f:
        f.write(struct.pack("<256i", 20240521, 1, T + 1, *([0] * 253)))
        f.write(bytes(mask))
    rc, st, err = run(sp, os.path.join(tmp, "run-mask"))
    check(rc == 0 and st is not None, f"mask: trains (exit {rc}) {err[-400:] if rc else ''}")
    if st:
        check(abs(st["loss"] - masked) <= 1e-4 * abs(masked),
              f"mask: loss {st['loss']:.7f} vs torch {masked:.7f} over {len(kept)} targets")
        check(abs(st["loss"] - full) > 1e-3, "mask: the masked loss differs from the full one")
        check(st.get("loss_tokens") == len(kept),
              f"mask: loss_tokens {st.get('loss_tokens')} == {len(kept)}")

    # a mask that does not fit its shard is refused, naming the file
    with open(os.path.join(data, "train_000.mask"), "wb") as f:
        f.write(struct.pack("<256i", 20240521, 1, T, *([0] * 253)))
        f.write(bytes(mask[:T]))
    rc, st, err = run(sp, os.path.join(tmp, "run-bad"))
    check(rc == 2 and st is None and "train_000.mask" in err,
          f"short mask: exit {rc}, message {err.strip().splitlines()[-1:] if err else ''}")
    with open(os.path.join(data, "train_000.mask"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, T + 1, *([0] * 253)))
        f.write(bytes(mask))
    rc, st, err = run(sp, os.path.join(tmp, "run-magic"))
    check(rc == 2 and "not a loss-mask shard" in err, f"wrong magic: exit {rc}")
    # a loss on part of the tokens without mask shards is refused, not trained on all
    os.remove(os.path.join(data, "train_000.mask"))
    spec["data"]["format"] = "completion"
    spec["data"]["tokenizer"] = init
    spec["train"]["loss_on"] = "completion"
    json.dump(spec, open(sp, "w"))
    rc, st, err = run(sp, os.path.join(tmp, "run-nomask"))
    check(rc == 2 and st is None and "needs loss-mask shards" in err,
          f"loss_on completion without masks: exit {rc}")
    spec["train"]["loss_on"] = "all"
    # attention within documents needs to know where documents end (tests/datasets/
    # test_packing.py trains it): shards without meta.json are refused, not trained as concat
    spec["train"]["packing"] = "document"
    json.dump(spec, open(sp, "w"))
    rc, st, err = run(sp, os.path.join(tmp, "run-doc"))
    check(rc == 2 and st is None and "meta.json" in err, f"packing document: exit {rc}")
    subprocess.run(["rm", "-rf", tmp])
    print(f"{'FAIL' if failures else 'PASS'}: {failures} failure(s)", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
