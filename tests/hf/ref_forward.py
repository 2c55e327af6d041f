"""Independent reference forward of the Hugging Face architectures (torch, CPU).

  ref_forward.py DIR TOKENS N   ->  {"logprobs": [null, ...], "top": [null, ...],
                                     "logit_std": s, "greedy": [...], "margins": [...]}

logprobs[i] = log p(tokens[i] | tokens[:i]); top[i] = the largest log p(v | tokens[:i])
over the vocabulary (top[i] - logprobs[i] is how far tokens[i] is from the argmax);
logit_std = the standard deviation of the logits of the scored rows (the scale that
bf16 rounding errors of the logits are proportional to); greedy = N argmax tokens
after TOKENS and margins[k] = the gap between the best and second-best logit at
greedy step k.

  ref_forward.py DIR --determined LEN STEPS TIE SEED
      -> {"prompt": [...], "greedy": [...], "margins": [...], "logit_std": s, "tries": n}

searches prompts of LEN random tokens (a seeded stream) for the first whose STEPS greedy
tokens are all determined by more than TIE * logit_std (best minus second-best logit), so
that a lower-precision implementation must produce exactly those tokens, and none repeats
the token before it (the tied models' easy case, which depends little on the earlier
positions); "prompt" is null
when 3000 candidates gave none.

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


def determined(d, length, steps, tie, seed):
    import random

    cfg, w = load(d)
    V, rnd = cfg["vocab_size"], random.Random(seed)
    for tries in range(1, 3001):
        seq = [rnd.randrange(V) for _ in range(length)]
        std, margins = None, []
        for _ in range(steps):
            lg = logits(cfg, w, seq)
            if std is None:
                std = lg[:-1].std().item()
            two = torch.topk(lg[-1], 2).values
            margins.append((two[0] - two[1]).item())
            nxt = int(torch.argmax(lg[-1]).item())
            if margins[-1] <= tie * std or nxt == seq[-1]:
                break
            seq.append(nxt)
        if len(seq) == length + steps:
            return {"prompt": seq[:length], "greedy": seq[length:], "margins": margins,
                    "logit_std": std, "tries": tries}
    return {"prompt": None, "tries": 3000}


def main():
    if sys.argv[2] == "--determined":
        a = sys.argv
        print(json.dumps(determined(a[1], int(a[3]), int(a[4]), float(a[5]), int(a[6]))))
        return
    d, toks, n = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
    cfg, w = load(d)
    lg = logits(cfg, w, toks)
    lp = torch.log_softmax(lg, dim=-1)
    scores = [None] + [lp[i - 1, toks[i]].item() for i in range(1, len(toks))]
    top = [None] + [lp[i - 1].max().item() for i in range(1, len(toks))]
    std = lg[: max(len(toks) - 1, 1)].std().item() if len(toks) > 1 else lg.std().item()
    seq, greedy, margins = list(toks), [], []
    for _ in range(n):
        last = logits(cfg, w, seq)[-1]
        two = torch.topk(last, 2).values
        nxt = int(torch.argmax(last).item())
        greedy.append(nxt)
        margins.append((two[0] - two[1]).item())
        seq.append(nxt)
    print(json.dumps({"logprobs": scores, "top": top, "logit_std": std, "greedy": greedy,
                      "margins": margins}))


if __name__ == "__main__":
    main()
