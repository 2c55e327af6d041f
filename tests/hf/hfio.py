"""safetensors files and Hugging Face model directories, by hand (numpy only).

The format: 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
then the raw little-endian row-major data. Written here independently of
Loom's C code so that the tests check Loom against the format, not itself.
BF16 has no numpy dtype: it is carried as uint16 bit patterns.
"""
import json
import os
import struct

import numpy as np

NP = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I32": np.int32}


def f32_to_bf16_bits(a):
    """Round-to-nearest-even fp32 -> bf16 bit patterns (uint16)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def tensor_bytes(arr, dtype):
    if dtype == "BF16":
        return f32_to_bf16_bits(arr).tobytes()
    if dtype == "F8_E4M3":
        return np.zeros(arr.size, dtype=np.uint8).tobytes()
    return np.ascontiguousarray(arr, dtype=NP[dtype]).tobytes()


def write_safetensors(path, tensors, dtype, header_len=None, dtypes=None):
    """tensors: list of (name, float array); every tensor stored as `dtype`
    unless dtypes[name] says otherwise. header_len overrides the length
    field (for malformed files)."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, arr in tensors:
        dt = (dtypes or {}).get(name, dtype)
        b = tensor_bytes(arr, dt)
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h) if header_len is None else header_len))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)}"""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[name] = (v["dtype"], tuple(v["shape"]), data[8 + n + a : 8 + n + b])
    return out


def to_float(dtype, shape, raw):
    if dtype == "BF16":
        return bf16_bits_to_f32(np.frombuffer(raw, dtype=np.uint16)).reshape(shape)
    return np.frombuffer(raw, dtype=NP[dtype]).astype(np.float32).reshape(shape)


def read_model_dir(d):
    """All tensors of an HF directory (single file or index + shards)."""
    ix = os.path.join(d, "model.safetensors.index.json")
    files = (
        sorted(set(json.load(open(ix))["weight_map"].values()))
        if os.path.exists(ix)
        else ["model.safetensors"]
    )
    out = {}
    for f in files:
        out.update(read_safetensors(os.path.join(d, f)))
    return out
