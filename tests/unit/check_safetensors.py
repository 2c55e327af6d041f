#!/usr/bin/env python3
"""Independent check of Loom's safetensors export with only json + struct.

Runs `test_safetensors --write FILE` (the tiny GPT-2 export, parameter i =
(i % 1000) / 1000) and checks the file the way other tools read it: the
8-byte little-endian header length, the JSON header, dtypes, shapes, byte
ranges back to back up to the end of the file, the Hugging Face names, wte's
values, and that Conv1D weights are stored [in, out] (transposed).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile


def main():
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        out = subprocess.run([exe, "--write", path], check=True, capture_output=True, text=True)
        n_layer, d_model, vocab, seq_len, d_ff = map(int, out.stdout.split())
        data = open(path, "rb").read()
    (hlen,) = struct.unpack("<Q", data[:8])
    assert (8 + hlen) % 8 == 0, "header not padded to 8 bytes"
    header = json.loads(data[8:8 + hlen].decode("utf-8"))
    body = data[8 + hlen:]
    assert header.pop("__metadata__") .get("format") == "pt"
    sizes = {"F32": 4, "BF16": 2}
    spans = []
    for name, t in header.items():
        n = 1
        for s in t["shape"]:
            n *= s
        b, e = t["data_offsets"]
        assert e - b == n * sizes[t["dtype"]], name
        spans.append((b, e))
    spans.sort()
    pos = 0
    for b, e in spans:
        assert b == pos, "hole or overlap at %d" % b
        pos = e
    assert pos == len(body), "data section size mismatch"

    def tensor(name, shape):
        t = header[name]
        assert t["shape"] == shape, (name, t["shape"], shape)
        b, e = t["data_offsets"]
        return struct.unpack("<%df" % ((e - b) // 4), body[b:e])

    want = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
            "transformer.ln_f.bias"]
    for i in range(n_layer):
        for s in ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                  "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                  "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]:
            want.append("transformer.h.%d.%s" % (i, s))
    assert sorted(want) == sorted(header), set(want) ^ set(header)

    wte = tensor("transformer.wte.weight", [vocab, d_model])
    for k in range(0, len(wte), 97):
        assert abs(wte[k] - (k % 1000) / 1000.0) < 1e-6, k
    wpe = tensor("transformer.wpe.weight", [seq_len, d_model])
    assert len(wpe) == seq_len * d_model
    # c_attn file [i][j] = memory [j][i] = ((off + j*d + i) % 1000) / 1000
    w = tensor("transformer.h.0.attn.c_attn.weight", [d_model, 3 * d_model])
    step_col = round((w[1] - w[0]) * 1000) % 1000
    step_row = round((w[3 * d_model] - w[0]) * 1000) % 1000
    assert step_col == d_model % 1000 and step_row == 1, (step_col, step_row)
    tensor("transformer.h.0.mlp.c_fc.weight", [d_model, d_ff])
    tensor("transformer.h.0.mlp.c_proj.weight", [d_ff, d_model])
    print("ok: %d tensors, %d bytes" % (len(header), len(data)))


if __name__ == "__main__":
    main()
