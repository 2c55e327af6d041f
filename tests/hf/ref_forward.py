"""Independent reference forward of the Hugging Face architectures (torch, CPU).

  ref_forward.py DIR TOKENS N   ->  {"logprobs": [null, ...], "greedy": [...]}

Written from the architectures' math as transformers defines it (modeling_llama,
modeling_mistral, modeling_qwen2, modeling_gpt2), in float64, with no cache:
greedy continuation re-runs the whole sequence for every new token.
- Llama / Mistral / Qwen2: RMSNorm x * rsqrt(mean(x^2) + eps) * w; q/k/v
  projections (Qwen2 with biases); RoPE "rotate_half" with inv_freq =
  theta^(-2i/d) (rope_scaling llama3: transformers'
  _compute_llama3_parameters); grouped-query attention, causal softmax with
  scale 1/sqrt(d); o_proj; MLP down(silu(gate(x)) * up(x)); final norm;
  lm_head, or the embedding when tie_word_embeddings.
- GPT-2: wte + wpe; LayerNorm; Conv1D x @ W + b (W [in, out]); gelu_new;
  tied head.
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hfio  # noqa: E402

D = torch.float64


def load(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = {n: torch.tensor(hfio.to_float(*v), dtype=D) for n, v in hfio.read_model_dir(d).items()}
    return cfg, w


def inv_freq(cfg, hd):
    theta = cfg.get("rope_theta", 10000.0)
    f = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=D) / hd))
    rs = cfg.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / f
        scaled = torch.where(wl > lo_wl, f / factor, f)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wl >= hi_wl) & (wl <= lo_wl)
        f = torch.where(medium, smoothed, scaled)
    return f


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def attention(q, k, v):
    """q [H, T, d], k/v [Hkv, T, d] -> [T, H*d] causal."""
    H, T, d = q.shape
    rep = H // k.shape[0]
    k = k.repeat_interleave(rep, dim=0)
    v = v.repeat_interleave(rep, dim=0)
    s = q @ k.transpose(1, 2) / math.sqrt(d)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    s = s.masked_fill(mask, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).transpose(0, 1).reshape(T, H * d)


def llama_logits(cfg, w, toks):
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    hd, eps, T = C // H, cfg.get("rms_norm_eps", 1e-6), len(toks)

    def rms(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * g

    def lin(x, name):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if name + ".bias" in w else y

    f = inv_freq(cfg, hd)
    ang = torch.arange(T, dtype=D)[:, None] * f[None, :]
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = w["model.embed_tokens.weight"][toks]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = lin(h, p + "self_attn.q_proj").view(T, H, hd).transpose(0, 1)
        k = lin(h, p + "self_attn.k_proj").view(T, Hkv, hd).transpose(0, 1)
        v = lin(h, p + "self_attn.v_proj").view(T, Hkv, hd).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        x = x + lin(attention(q, k, v), p + "self_attn.o_proj")
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        g = lin(h, p + "mlp.gate_proj")
        x = x + lin(torch.nn.functional.silu(g) * lin(h, p + "mlp.up_proj"), p + "mlp.down_proj")
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def gpt2_logits(cfg, w, toks):
    C, H, T = cfg["n_embd"], cfg["n_head"], len(toks)
    eps, hd = cfg.get("layer_norm_epsilon", 1e-5), C // H

    def ln(x, p):
        m = x.mean(-1, keepdim=True)
        var = ((x - m) ** 2).mean(-1, keepdim=True)
        return (x - m) / torch.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def conv(x, p):
        return x @ w[p + ".weight"] + w[p + ".bias"]

    def gelu_new(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    x = w["transformer.wte.weight"][toks] + w["transformer.wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        qkv = conv(ln(x, p + "ln_1"), p + "attn.c_attn")
        q, k, v = (t.view(T, H, hd).transpose(0, 1) for t in qkv.split(C, dim=-1))
        x = x + conv(attention(q, k, v), p + "attn.c_proj")
        x = x + conv(gelu_new(conv(ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    return ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].T


def logits(cfg, w, toks):
    fn = gpt2_logits if cfg["architectures"][0] == "GPT2LMHeadModel" else llama_logits
    return fn(cfg, w, torch.tensor(toks))


def main():
    d, toks, n = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
    cfg, w = load(d)
    lp = torch.log_softmax(logits(cfg, w, toks), dim=-1)
    scores = [None] + [lp[i - 1, toks[i]].item() for i in range(1, len(toks))]
    seq, greedy = list(toks), []
    for _ in range(n):
        nxt = int(torch.argmax(logits(cfg, w, seq)[-1]).item())
        greedy.append(nxt)
        seq.append(nxt)
    print(json.dumps({"logprobs": scores, "greedy": greedy}))


if __name__ == "__main__":
    main()
