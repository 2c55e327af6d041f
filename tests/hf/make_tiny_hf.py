"""Write random tiny Hugging Face model directories in the exact HF layout.

  make_tiny_hf.py OUT        good models: OUT/<name>/ for every name in MODELS
  make_tiny_hf.py --bad OUT  malformed directories: OUT/<case>/ (see BAD)

Tensor names and shapes follow transformers' LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM and GPT2LMHeadModel (GPT-2's Conv1D
weights [in, out]). numpy only; the values are N(0, 0.15) from a seeded
generator, norms around 1, so the logits are far from uniform.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hfio  # noqa: E402

V, C, L, NH, NKV, F, POS = 300, 128, 2, 4, 2, 96, 128

MODELS = {
    # name: (architecture, dtype, tied, extra config, shards)
    "llama": ("LlamaForCausalLM", "F32", False, {"rope_theta": 10000.0, "rms_norm_eps": 1e-5}, 1),
    "llama3": (
        "LlamaForCausalLM",
        "F32",
        True,
        {
            "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
        1,
    ),
    "mistral": ("MistralForCausalLM", "F32", False, {"rope_theta": 1e6, "sliding_window": None}, 1),
    "qwen2": ("Qwen2ForCausalLM", "F32", True, {"rope_theta": 1e6, "rms_norm_eps": 1e-6}, 1),
    "gpt2": ("GPT2LMHeadModel", "F32", True, {}, 1),
    "llama_bf16": ("LlamaForCausalLM", "BF16", False, {"rope_theta": 10000.0}, 2),
    "qwen2_f16": ("Qwen2ForCausalLM", "F16", False, {"rope_theta": 1e6}, 1),
    # a vocabulary of 70000 x 64 = 4.48M embedding values: more than the loader's 4M-float
    # staging buffer, so the embedding is converted in two passes
    "gpt2_wide": ("GPT2LMHeadModel", "BF16", True, {"vocab_size": 70000}, 1),
}

TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "GPT2LMHeadModel": "gpt2",
}


def config(arch, dtype, tied, extra):
    torch_dtype = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[dtype]
    if arch == "GPT2LMHeadModel":
        c = {"n_embd": C, "n_layer": L, "n_head": NH, "n_positions": POS, "n_ctx": POS,
             "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5}
    else:
        c = {"hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
             "num_attention_heads": NH, "num_key_value_heads": NKV, "hidden_act": "silu",
             "max_position_embeddings": POS, "rms_norm_eps": 1e-6,
             "tie_word_embeddings": tied, "head_dim": C // NH}
    c.update({"architectures": [arch], "model_type": TYPES[arch], "vocab_size": V,
              "torch_dtype": torch_dtype, "bos_token_id": 1})
    c.update(extra)
    return c


def tensors(arch, tied, rng, ffn=F, V=V):
    def w(*shape, s=0.15):
        return rng.normal(0, s, size=shape).astype(np.float32)

    def norm():
        return (1 + rng.normal(0, 0.1, size=(C,))).astype(np.float32)

    t = []
    if arch == "GPT2LMHeadModel":
        t += [("transformer.wte.weight", w(V, C)), ("transformer.wpe.weight", w(POS, C, s=0.05))]
        for i in range(L):
            p = f"transformer.h.{i}."
            t += [(p + "ln_1.weight", norm()), (p + "ln_1.bias", w(C, s=0.05)),
                  (p + "attn.c_attn.weight", w(C, 3 * C)), (p + "attn.c_attn.bias", w(3 * C)),
                  (p + "attn.c_proj.weight", w(C, C)), (p + "attn.c_proj.bias", w(C, s=0.05)),
                  (p + "ln_2.weight", norm()), (p + "ln_2.bias", w(C, s=0.05)),
                  (p + "mlp.c_fc.weight", w(C, 4 * C)), (p + "mlp.c_fc.bias", w(4 * C)),
                  (p + "mlp.c_proj.weight", w(4 * C, C)), (p + "mlp.c_proj.bias", w(C, s=0.05))]
        t += [("transformer.ln_f.weight", norm()), ("transformer.ln_f.bias", w(C, s=0.05))]
        return t
    hd = C // NH
    t.append(("model.embed_tokens.weight", w(V, C, s=0.5)))
    for i in range(L):
        p = f"model.layers.{i}."
        t += [(p + "input_layernorm.weight", norm()),
              (p + "self_attn.q_proj.weight", w(NH * hd, C)),
              (p + "self_attn.k_proj.weight", w(NKV * hd, C)),
              (p + "self_attn.v_proj.weight", w(NKV * hd, C)),
              (p + "self_attn.o_proj.weight", w(C, NH * hd))]
        if arch == "Qwen2ForCausalLM":
            t += [(p + "self_attn.q_proj.bias", w(NH * hd)),
                  (p + "self_attn.k_proj.bias", w(NKV * hd)),
                  (p + "self_attn.v_proj.bias", w(NKV * hd))]
        t += [(p + "post_attention_layernorm.weight", norm()),
              (p + "mlp.gate_proj.weight", w(ffn, C)), (p + "mlp.up_proj.weight", w(ffn, C)),
              (p + "mlp.down_proj.weight", w(C, ffn))]
    t.append(("model.norm.weight", norm()))
    if not tied:
        t.append(("lm_head.weight", w(V, C)))
    return t


def write_dir(d, cfg, ts, dtype, shards, header_len=None, dtypes=None):
    os.makedirs(d, exist_ok=True)
    if cfg is not None:
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": 1, "do_sample": False},
              open(os.path.join(d, "generation_config.json"), "w"))
    # a stand-in tokenizer file: the export must copy it byte for byte
    json.dump({"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0}}},
              open(os.path.join(d, "tokenizer.json"), "w"))
    if shards == 1:
        hfio.write_safetensors(os.path.join(d, "model.safetensors"), ts, dtype, header_len, dtypes)
        return
    cut = len(ts) // 2
    parts = [ts[:cut], ts[cut:]]
    wm, total = {}, 0
    for k, part in enumerate(parts):
        name = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
        hfio.write_safetensors(os.path.join(d, name), part, dtype)
        for n, a in part:
            wm[n] = name
            total += len(hfio.tensor_bytes(a, dtype))
    json.dump({"metadata": {"total_size": total}, "weight_map": wm},
              open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=2)


def make_good(out):
    for k, (name, (arch, dtype, tied, extra, shards)) in enumerate(sorted(MODELS.items())):
        rng = np.random.default_rng(1000 + k)
        cfg = config(arch, dtype, tied, extra)
        write_dir(os.path.join(out, name), cfg, tensors(arch, tied, rng, V=cfg["vocab_size"]),
                  dtype, shards)


# bad case: (directory, expected error code)
BAD = {
    "no_config": "HF_CONFIG_MISSING",
    "falcon": "UNSUPPORTED_ARCHITECTURE",
    "shape": "HF_SHAPE_MISMATCH",
    "truncated_header": "SAFETENSORS_HEADER",
    "oversized_header": "SAFETENSORS_HEADER",
    "dtype_f8": "HF_DTYPE",
    "dtype_i32": "HF_DTYPE",
    "no_weights": "HF_WEIGHTS_MISSING",
    "rope_yarn": "HF_CONFIG_UNSUPPORTED",
    "no_lm_head": "HF_TENSOR_MISSING",
    "index_bad_file": "HF_TENSOR_MISSING",
}


def make_bad(out):
    rng = np.random.default_rng(7)
    arch = "LlamaForCausalLM"
    good_cfg = config(arch, "F32", False, {})
    ts = tensors(arch, False, rng)
    write_dir(os.path.join(out, "no_config"), None, ts, "F32", 1)
    cfg = dict(good_cfg, architectures=["FalconForCausalLM"], model_type="falcon")
    write_dir(os.path.join(out, "falcon"), cfg, ts, "F32", 1)
    # config says intermediate_size 96, the tensors have 80
    write_dir(os.path.join(out, "shape"), good_cfg, tensors(arch, False, rng, ffn=80), "F32", 1)
    # header length past the end of the file; and one above the 100 MiB limit
    write_dir(os.path.join(out, "truncated_header"), good_cfg, ts, "F32", 1, header_len=1 << 24)
    write_dir(os.path.join(out, "oversized_header"), good_cfg, ts, "F32", 1, header_len=1 << 40)
    first = ts[0][0]
    write_dir(os.path.join(out, "dtype_f8"), good_cfg, ts, "F32", 1, dtypes={first: "F8_E4M3"})
    write_dir(os.path.join(out, "dtype_i32"), good_cfg, ts, "F32", 1, dtypes={first: "I32"})
    d = os.path.join(out, "no_weights")
    os.makedirs(d, exist_ok=True)
    json.dump(good_cfg, open(os.path.join(d, "config.json"), "w"))
    cfg = dict(good_cfg, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    write_dir(os.path.join(out, "rope_yarn"), cfg, ts, "F32", 1)
    # untied config, no lm_head.weight in the file
    write_dir(os.path.join(out, "no_lm_head"), good_cfg, ts[:-1], "F32", 1)
    # the index names a shard for a tensor that shard does not hold
    d = os.path.join(out, "index_bad_file")
    write_dir(d, good_cfg, ts, "F32", 2)
    ix = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    ix["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors"
    json.dump(ix, open(os.path.join(d, "model.safetensors.index.json"), "w"))


if __name__ == "__main__":
    if sys.argv[1] == "--bad":
        make_bad(sys.argv[2])
    else:
        make_good(sys.argv[1])
