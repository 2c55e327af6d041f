"""Load time of an 8B-shaped Hugging Face model into loom-worker, beside a plain read.

  hf_load_bench.py --worker BIN/loom-worker --dir DIR [--device cuda] [--layers 32]
                   [--vocab 128256] [--shards 4] [--reuse] [--runs 3]

Writes a random Llama 3 8B-shaped model in the Hugging Face layout into DIR (config.json
of LlamaForCausalLM: hidden 4096, 32 heads, 8 kv heads, intermediate 14336, vocabulary
128256, untied head; bf16 tensors in --shards safetensors files with an index; 16.1 GB
at the full 32 layers, --layers makes it smaller), reads the files once so that they are
in the page cache, then in one call measures
  - plain read: `cat FILES > /dev/null`, and a read() loop of 16 MiB into one buffer;
  - Loom: `loom-worker --init-from DIR --score-tokens 1,2 --device D`, the time of the
    import from the worker's own line "loaded its share of DIR (X of Y bytes) in S s"
    (every shard mapped, each tensor converted to the device's dtype and copied over),
and prints the best of --runs for each and the ratio Loom / plain read (issue goal:
at least 0.8). The tensor values are random bf16 in [-2^-6, 2^-6] (a 64 MiB random block
repeated: the bytes matter only for their count), so scoring gives finite numbers.
The safetensors files are written here from the format's description (8-byte header
length, JSON header, raw data), not by Loom's code. Needs numpy.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import time

import numpy as np

C, F, NH, NKV = 4096, 14336, 32, 8
HD = C // NH
BLOCK = 64 << 20


def tensors(layers, vocab):
    """(name, shape) in the order transformers saves Llama."""
    t = [("model.embed_tokens.weight", (vocab, C))]
    for i in range(layers):
        p = f"model.layers.{i}."
        t += [(p + "input_layernorm.weight", (C,)),
              (p + "self_attn.q_proj.weight", (NH * HD, C)),
              (p + "self_attn.k_proj.weight", (NKV * HD, C)),
              (p + "self_attn.v_proj.weight", (NKV * HD, C)),
              (p + "self_attn.o_proj.weight", (C, NH * HD)),
              (p + "post_attention_layernorm.weight", (C,)),
              (p + "mlp.gate_proj.weight", (F, C)),
              (p + "mlp.up_proj.weight", (F, C)),
              (p + "mlp.down_proj.weight", (C, F))]
    t += [("model.norm.weight", (C,)), ("lm_head.weight", (vocab, C))]
    return t


def nbytes(shape):
    n = 2
    for s in shape:
        n *= s
    return n


def random_block():
    """BLOCK bytes of bf16 values: random sign and mantissa, exponent 2^-7 (no NaN/Inf)."""
    rng = np.random.default_rng(8)
    u = rng.integers(0, 1 << 16, size=BLOCK // 2, dtype=np.uint16)
    return ((u & 0x807F) | 0x3C00).astype("<u2").tobytes()


def write_model(d, layers, vocab, shards):
    os.makedirs(d, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
           "intermediate_size": F, "num_hidden_layers": layers, "num_attention_heads": NH,
           "num_key_value_heads": NKV, "head_dim": HD, "hidden_act": "silu",
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "tie_word_embeddings": False, "vocab_size": vocab, "torch_dtype": "bfloat16",
           "bos_token_id": 128000, "eos_token_id": 128001}
    ts = tensors(layers, vocab)
    total = sum(nbytes(s) for _, s in ts)
    # cut into shards of about equal size at tensor boundaries
    groups, cur, acc = [], [], 0
    for name, shape in ts:
        cur.append((name, shape))
        acc += nbytes(shape)
        if acc >= total * (len(groups) + 1) / shards and len(groups) < shards - 1:
            groups.append(cur)
            cur = []
    groups.append(cur)
    blk = memoryview(random_block())
    wm, pos = {}, 0
    for k, g in enumerate(groups):
        fname = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        header, off = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in g:
            header[name] = {"dtype": "BF16", "shape": list(shape),
                            "data_offsets": [off, off + nbytes(shape)]}
            off += nbytes(shape)
            wm[name] = fname
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(d, fname), "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            left = off
            while left:
                a = pos % BLOCK
                n = min(left, BLOCK - a)
                f.write(blk[a:a + n])
                pos += n
                left -= n
    json.dump({"metadata": {"total_size": total}, "weight_map": wm},
              open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    return total


def shard_files(d):
    ix = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    return [os.path.join(d, f) for f in sorted(set(ix["weight_map"].values()))]


def read_loop(files):
    buf = bytearray(16 << 20)
    mv = memoryview(buf)
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(mv):
                pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reuse", action="store_true", help="keep a model DIR already holds")
    a = ap.parse_args()
    if not (a.reuse and os.path.exists(os.path.join(a.dir, "config.json"))):
        t = time.time()
        total = write_model(a.dir, a.layers, a.vocab, a.shards)
        print(f"wrote {total / 1e9:.2f} GB ({a.layers} layers, vocab {a.vocab}) in "
              f"{len(shard_files(a.dir))} shards to {a.dir} in {time.time() - t:.1f} s")
    files = shard_files(a.dir)
    size = sum(os.path.getsize(p) for p in files)
    read_loop(files)  # into the page cache
    cat, loop, loom, wall = [], [], [], []
    for _ in range(a.runs):
        t = time.time()
        subprocess.run("cat " + " ".join(files) + " > /dev/null", shell=True, check=True)
        cat.append(time.time() - t)
        t = time.time()
        read_loop(files)
        loop.append(time.time() - t)
        t = time.time()
        p = subprocess.run([a.worker, "--init-from", a.dir, "--score-tokens", "1,2", "--device",
                            a.device, "--log-level", "info"], capture_output=True, text=True)
        wall.append(time.time() - t)
        m = re.search(r"loaded its share of \S+ \((\d+) of (\d+) bytes of weights\) in ([0-9.]+) s",
                      p.stderr)
        if p.returncode != 0 or not m:
            print(f"FAIL: loom-worker exit {p.returncode}: {p.stderr[-800:]}")
            sys.exit(1)
        loom.append(float(m.group(3)))
        read_bytes = int(m.group(1))
    gb = size / 1e9
    print(f"files: {gb:.2f} GB in {len(files)} shards; device {a.device}; best of {a.runs}")
    print(f"plain read, cat > /dev/null:   {min(cat):.3f} s  {gb / min(cat):6.2f} GB/s")
    print(f"plain read, read() 16 MiB:     {min(loop):.3f} s  {gb / min(loop):6.2f} GB/s")
    print(f"loom import ({read_bytes / 1e9:.2f} GB read): {min(loom):.3f} s  "
          f"{read_bytes / 1e9 / min(loom):6.2f} GB/s   (whole worker call {min(wall):.2f} s)")
    ratio = (read_bytes / min(loom)) / (size / min(cat))
    print(f"ratio loom / cat: {ratio:.2f}x (goal >= 0.8)")


if __name__ == "__main__":
    main()
