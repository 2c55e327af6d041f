/* Unit tests of api/model: preset parameter counts against the published
 * models, layout order and names, tensor-parallel shapes, pipeline stage
 * placement, FLOPs per token and config checks. */
#include "api/model.h"
#include "tests/check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Published parameter counts. GPT-2 counts are Hugging Face's (vocab 50257)
 * plus the padding rows (50304 - 50257) * d_model that the padded
 * embedding holds; Llama counts are the Hugging Face checkpoints'. */
static const struct {
    enum model_family fam;
    const char *preset;
    int64_t params;
} counts[] = {
    {MODEL_GPT2, "124m", 124439808LL + 47LL * 768},
    {MODEL_GPT2, "350m", 354823168LL + 47LL * 1024},
    {MODEL_GPT2, "774m", 774030080LL + 47LL * 1280},
    {MODEL_GPT2, "1558m", 1557611200LL + 47LL * 1600},
    {MODEL_LLAMA, "1b", 1235814400LL},
    {MODEL_LLAMA, "7b", 6738415616LL},
    {MODEL_LLAMA, "8b", 8030261248LL},
    {MODEL_LLAMA, "13b", 13015864320LL},
    {MODEL_LLAMA, "70b", 68976648192LL},
};

static const struct model_tensor *find(const struct model_layout *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->t[i].name, name) == 0) return &l->t[i];
    return NULL;
}

static void test_counts(void) {
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        const struct model_preset *p = model_preset_find(counts[i].fam, counts[i].preset);
        CHECK(p != NULL);
        if (!p) continue;
        int64_t n = model_n_params(&p->config);
        if (n != counts[i].params)
            fprintf(stderr, "preset %s: %lld params, expected %lld\n", counts[i].preset,
                    (long long)n, (long long)counts[i].params);
        CHECK(n == counts[i].params);
    }
    CHECK(model_preset_find(MODEL_GPT2, "70b") == NULL);
    CHECK(model_preset_find(MODEL_LLAMA, "nope") == NULL);
}

static void test_presets_valid(void) {
    size_t n;
    const struct model_preset *p = model_presets(&n);
    CHECK(n >= 12);
    for (size_t i = 0; i < n; i++) {
        char err[256];
        const char *field;
        CHECK(model_config_check(&p[i].config, err, sizeof err, &field) == 0);
        CHECK(p[i].config.padded_vocab % MODEL_VOCAB_PAD == 0);
        CHECK(p[i].config.padded_vocab >= p[i].config.vocab_size);
        CHECK(p[i].config.padded_vocab - p[i].config.vocab_size < MODEL_VOCAB_PAD);
        struct model_config c = p[i].config;
        model_config_finalize(&c);
        CHECK(c.padded_vocab == p[i].config.padded_vocab);
    }
    const struct model_preset *g = model_preset_find(MODEL_GPT2, "124m");
    CHECK(g && g->config.padded_vocab == 50304 && g->config.n_layer == 12 &&
          g->config.d_model == 768 && g->config.tied_embeddings);
    const struct model_preset *l70 = model_preset_find(MODEL_LLAMA, "70b");
    CHECK(l70 && l70->config.n_kv_head == 8 && l70->config.n_head == 64 && !l70->config.bias);
}

static void test_gpt2_layout(void) {
    const struct model_preset *p = model_preset_find(MODEL_GPT2, "124m");
    struct model_layout l;
    CHECK(model_layout_init(&l, &p->config, 1) == 0);
    CHECK(l.n == 2 + 12 * 12 + 2); /* wte, wpe, 12 per block, ln_f w+b; tied: no lm_head */
    CHECK(strcmp(l.t[0].name, "transformer.wte.weight") == 0);
    CHECK(strcmp(l.t[1].name, "transformer.wpe.weight") == 0);
    CHECK(strcmp(l.t[2].name, "transformer.h.0.ln_1.weight") == 0);
    CHECK(strcmp(l.t[l.n - 1].name, "transformer.ln_f.bias") == 0);
    CHECK(find(&l, "lm_head.weight") == NULL);
    const struct model_tensor *qkv = find(&l, "transformer.h.0.attn.c_attn.weight");
    CHECK(qkv && qkv->shape[0] == 3 * 768 && qkv->shape[1] == 768 && qkv->parts == 3 &&
          qkv->split == MODEL_SPLIT_COLUMN && qkv->decay && qkv->layer == 0);
    const struct model_tensor *b = find(&l, "transformer.h.11.mlp.c_fc.bias");
    CHECK(b && b->ndim == 1 && b->shape[0] == 3072 && !b->decay && b->layer == 11);
    CHECK(!l.t[0].decay && !l.t[1].decay && l.t[0].layer == -1);
    /* offsets are contiguous and sum to the total */
    int64_t off = 0;
    for (int i = 0; i < l.n; i++) {
        CHECK(l.t[i].offset == off);
        off += l.t[i].numel;
    }
    CHECK(off == l.numel && l.rank_numel == l.numel);
    CHECK(model_n_params(&p->config) == l.numel); /* one-block shortcut == full table */
    model_layout_free(&l);

    /* tp = 4: column, row, vocab and replicated shapes */
    CHECK(model_layout_init(&l, &p->config, 4) == 0);
    qkv = find(&l, "transformer.h.3.attn.c_attn.weight");
    CHECK(qkv && qkv->rank_shape[0] == 3 * 768 / 4 && qkv->rank_shape[1] == 768);
    const struct model_tensor *proj = find(&l, "transformer.h.3.attn.c_proj.weight");
    CHECK(proj && proj->split == MODEL_SPLIT_ROW && proj->rank_shape[0] == 768 &&
          proj->rank_shape[1] == 192);
    const struct model_tensor *pb = find(&l, "transformer.h.3.attn.c_proj.bias");
    CHECK(pb && pb->split == MODEL_SPLIT_REPLICATED && pb->rank_numel == 768);
    CHECK(l.t[0].split == MODEL_SPLIT_VOCAB && l.t[0].rank_shape[0] == 50304 / 4);
    CHECK(l.rank_numel < l.numel && l.rank_numel > l.numel / 4);
    model_layout_free(&l);

    /* tp = 5 does not divide d_model 768 heads' columns */
    CHECK(model_layout_init(&l, &p->config, 5) == -1);
    CHECK(l.t == NULL && l.n == 0);
    model_layout_free(&l);
}

static void test_llama_layout(void) {
    const struct model_preset *p = model_preset_find(MODEL_LLAMA, "70b");
    struct model_layout l;
    CHECK(model_layout_init(&l, &p->config, 8) == 0);
    CHECK(l.n == 1 + 80 * 9 + 2);
    CHECK(strcmp(l.t[0].name, "model.embed_tokens.weight") == 0);
    CHECK(strcmp(l.t[l.n - 1].name, "lm_head.weight") == 0 && l.t[l.n - 1].decay);
    CHECK(strcmp(l.t[l.n - 2].name, "model.norm.weight") == 0);
    const struct model_tensor *k = find(&l, "model.layers.79.self_attn.k_proj.weight");
    CHECK(k && k->shape[0] == 1024 && k->shape[1] == 8192 && k->rank_shape[0] == 128);
    const struct model_tensor *down = find(&l, "model.layers.0.mlp.down_proj.weight");
    CHECK(down && down->shape[0] == 8192 && down->shape[1] == 28672 &&
          down->rank_shape[1] == 28672 / 8);
    const struct model_tensor *n = find(&l, "model.layers.5.post_attention_layernorm.weight");
    CHECK(n && !n->decay && n->split == MODEL_SPLIT_REPLICATED);
    CHECK(find(&l, "model.layers.0.self_attn.q_proj.bias") == NULL);
    int64_t sum = 0;
    for (int i = 0; i < l.n; i++)
        sum += l.t[i].rank_numel;
    CHECK(sum == l.rank_numel);
    /* all split tensors divide exactly at tp=8, only replicated norms remain whole */
    int64_t norms = (2 * 80 + 1) * 8192LL;
    CHECK(l.rank_numel == (l.numel - norms) / 8 + norms);
    CHECK(model_n_params(&p->config) == l.numel);

    /* pipeline stages: pp=4 cuts 20 layers each; embeddings first, head last */
    int64_t total = 0;
    for (int s = 0; s < 4; s++)
        total += model_layout_stage_numel(&l, &p->config, 4, s);
    CHECK(total == l.rank_numel); /* untied: every tensor on exactly one stage */
    CHECK(model_tensor_on_stage(&p->config, &l.t[0], 4, 0));
    CHECK(!model_tensor_on_stage(&p->config, &l.t[0], 4, 3));
    CHECK(model_tensor_on_stage(&p->config, &l.t[l.n - 1], 4, 3));
    CHECK(model_tensor_on_stage(&p->config, find(&l, "model.layers.40.mlp.up_proj.weight"), 4, 2));
    model_layout_free(&l);

    /* tied gpt2 with pp=2: the embedding appears on both stages */
    const struct model_preset *g = model_preset_find(MODEL_GPT2, "tiny");
    CHECK(model_layout_init(&l, &g->config, 1) == 0);
    CHECK(model_tensor_on_stage(&g->config, &l.t[0], 2, 0) &&
          model_tensor_on_stage(&g->config, &l.t[0], 2, 1));
    CHECK(model_layout_stage_numel(&l, &g->config, 2, 0) +
              model_layout_stage_numel(&l, &g->config, 2, 1) ==
          l.numel + l.t[0].numel);
    model_layout_free(&l);
}

static void test_flops(void) {
    const struct model_preset *p = model_preset_find(MODEL_GPT2, "124m");
    const struct model_config *c = &p->config;
    int64_t C = 768, L = 12, V = 50304;
    int64_t matmul = V * C + L * (3 * C * C + C * C + 4 * C * C + 4 * C * C);
    CHECK(model_n_matmul_params(c) == matmul);
    double want = 6.0 * (double)matmul + 12.0 * L * C * 1024;
    CHECK(fabs(model_flops_per_token(c, 1024) - want) < 1.0);
    /* llama 7b: untied input embedding is a look-up, lm_head is a matmul */
    const struct model_preset *q = model_preset_find(MODEL_LLAMA, "7b");
    int64_t n = model_n_params(&q->config);
    int64_t norms = (2 * 32 + 1) * 4096LL;
    CHECK(model_n_matmul_params(&q->config) == n - 32000LL * 4096 - norms);
}

/* Adapter counts as PEFT's print_trainable_parameters gives them for the
 * real checkpoints of these shapes, and LoRA's FLOPs from the sizes. */
static void test_lora_counts(void) {
    const char *all[] = {"q", "k", "v", "o", "gate", "up", "down"}, *qv[] = {"q", "v"};
    const char *attn[] = {"attn"}, *bad[] = {"q", "fc"};
    const struct model_config *l3 = &model_preset_find(MODEL_LLAMA, "8b")->config;
    const struct model_config *l2 = &model_preset_find(MODEL_LLAMA, "7b")->config;
    const struct model_config *g2 = &model_preset_find(MODEL_GPT2, "124m")->config;
    CHECK(model_lora_params(l3, 16, all, 7) == 41943040); /* Meta-Llama-3-8B, r 16, all linear */
    CHECK(model_lora_params(l2, 8, qv, 2) == 4194304);    /* Llama-2-7b, r 8, q_proj v_proj */
    CHECK(model_lora_params(g2, 8, attn, 1) == 294912);   /* gpt2, r 8, c_attn */
    CHECK(model_lora_params(l3, 16, bad, 2) == -1);       /* fc is GPT-2's */
    int64_t in, out;
    int row;
    CHECK(model_lora_site(l3, "down", &in, &out, &row) == 0 && in == 14336 && out == 4096 && row);
    CHECK(model_lora_site(l3, "k", &in, &out, &row) == 0 && in == 4096 && out == 1024 && !row);
    /* 4 FLOPs a frozen matmul weight (forward, input gradient), 6 an adapter
     * parameter, 12 L C T for attention */
    int64_t mm = 32LL * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336) + 128256LL * 4096;
    double want = 4.0 * mm + 6.0 * 41943040 + 12.0 * 32 * 4096 * 2048;
    CHECK(fabs(model_lora_flops_per_token(l3, 2048, 41943040) - want) < 1.0);
}

static const struct {
    const char *what;
    int n_layer, n_head, n_kv_head, d_model, d_ff, vocab, seq;
    enum model_family fam;
    const char *field; /* NULL: valid */
} checks[] = {
    {"ok gpt2", 2, 4, 4, 64, 256, 512, 64, MODEL_GPT2, NULL},
    {"ok llama gqa", 2, 8, 2, 128, 256, 512, 64, MODEL_LLAMA, NULL},
    {"zero layers", 0, 4, 4, 64, 256, 512, 64, MODEL_GPT2, "n_layer"},
    {"negative heads", 2, -4, 4, 64, 256, 512, 64, MODEL_GPT2, "n_head"},
    {"heads not dividing d_model", 2, 5, 5, 64, 256, 512, 64, MODEL_GPT2, "n_head"},
    {"kv not dividing heads", 2, 8, 3, 128, 256, 512, 64, MODEL_LLAMA, "n_kv_head"},
    {"gqa on gpt2", 2, 8, 2, 128, 256, 512, 64, MODEL_GPT2, "n_kv_head"},
    {"odd rope head dim", 2, 8, 8, 40, 256, 512, 64, MODEL_LLAMA, "n_head"},
    {"zero vocab", 2, 4, 4, 64, 256, 0, 64, MODEL_GPT2, "vocab_size"},
    {"zero seq", 2, 4, 4, 64, 256, 512, 0, MODEL_GPT2, "seq_len"},
    {"zero d_ff", 2, 4, 4, 64, 0, 512, 64, MODEL_GPT2, "d_ff"},
};

static void test_check(void) {
    for (size_t i = 0; i < sizeof checks / sizeof *checks; i++) {
        struct model_config c;
        memset(&c, 0, sizeof c);
        model_config_family_defaults(&c, checks[i].fam);
        c.n_layer = checks[i].n_layer;
        c.n_head = checks[i].n_head;
        c.n_kv_head = checks[i].n_kv_head;
        c.d_model = checks[i].d_model;
        c.d_ff = checks[i].d_ff;
        c.vocab_size = checks[i].vocab;
        c.seq_len = checks[i].seq;
        model_config_finalize(&c);
        char err[256] = "";
        const char *field = "unset";
        int rc = model_config_check(&c, err, sizeof err, &field);
        int ok = checks[i].field
                     ? (rc == -1 && field && strcmp(field, checks[i].field) == 0 && err[0] != '\0')
                     : (rc == 0 && field == NULL);
        if (!ok)
            fprintf(stderr, "case '%s': rc=%d field=%s err=%s\n", checks[i].what, rc,
                    field ? field : "(null)", err);
        CHECK(ok);
    }
    CHECK(model_family_parse("gpt2") == MODEL_GPT2 && model_family_parse("llama") == MODEL_LLAMA);
    CHECK(model_family_parse("bert") == -1);
}

/* Work of one block and of the head, as model_stage_layers counts them. */
static void work(const struct model_config *c, double *block, double *head) {
    double C = c->d_model, hd = C / c->n_head;
    double mlp = c->act == MODEL_ACT_SWIGLU ? 3.0 * C * c->d_ff : 2.0 * C * c->d_ff;
    double attn = C * (c->n_head + 2.0 * c->n_kv_head) * hd + C * C;
    *block = 6 * (mlp + attn) + 12 * C * c->seq_len;
    *head = 6.0 * c->padded_vocab * C;
}

/* The smallest possible "most work on one stage" over every split of L
 * blocks into pp contiguous non-empty stages (brute force, small L). */
static double best_max(int L, int pp, double b, double h) {
    if (pp == 1) return L * b + h;
    double best = 1e300;
    for (int n = 1; n <= L - (pp - 1); n++) {
        double rest = best_max(L - n, pp - 1, b, h), w = n * b;
        double m = w > rest ? w : rest;
        if (m < best) best = m;
    }
    return best;
}

static void test_stage_split(void) {
    /* even split: GPT-2 XL over 2 stages, 24 + 24 */
    const struct model_preset *xl = model_preset_find(MODEL_GPT2, "1558m");
    struct model_config c = xl->config;
    int l0, l1;
    model_stage_layers(&c, 2, 0, &l0, &l1);
    CHECK(l0 == 0 && l1 == 24);
    model_stage_layers(&c, 2, 1, &l0, &l1);
    CHECK(l0 == 24 && l1 == 48);
    /* balanced: the classifier (6 * 50304 * 1600 FLOPs a token) weighs about
     * 2.4 blocks, so the last stage gives up one block: 25 + 23 */
    c.pp_balance = 1;
    model_stage_layers(&c, 2, 0, &l0, &l1);
    CHECK(l0 == 0 && l1 == 25);
    model_stage_layers(&c, 2, 1, &l0, &l1);
    CHECK(l0 == 25 && l1 == 48);
    /* every preset, pp 1..8 (and n_layer when smaller), both modes: contiguous
     * non-empty stages covering every block; balanced: the most even split
     * there is (brute force for up to 16 blocks), never worse than even */
    size_t np;
    const struct model_preset *ps = model_presets(&np);
    for (size_t i = 0; i < np; i++) {
        for (int bal = 0; bal < 2; bal++) {
            struct model_config k = ps[i].config;
            k.pp_balance = bal;
            for (int pp = 1; pp <= 8 && pp <= k.n_layer; pp++) {
                if (!bal && k.n_layer % pp) continue;
                double b, h, worst = 0, worst_even = 0;
                work(&k, &b, &h);
                int next = 0, ok = 1;
                for (int s = 0; s < pp; s++) {
                    model_stage_layers(&k, pp, s, &l0, &l1);
                    ok &= l0 == next && l1 > l0;
                    next = l1;
                    double w = (l1 - l0) * b + (s == pp - 1 ? h : 0);
                    if (w > worst) worst = w;
                }
                ok &= next == k.n_layer;
                if (!ok) fprintf(stderr, "split of %s pp=%d bal=%d\n", ps[i].name, pp, bal);
                CHECK(ok);
                if (bal && k.n_layer % pp == 0) {
                    worst_even = (k.n_layer / pp) * b + h;
                    CHECK(worst <= worst_even * (1 + 1e-12));
                }
                if (bal && k.n_layer <= 16)
                    CHECK(fabs(worst - best_max(k.n_layer, pp, b, h)) <= 1e-9 * worst);
            }
        }
    }
    /* the placement follows the split: a block's tensors are on one stage */
    struct model_layout lay;
    CHECK(model_layout_init(&lay, &c, 1) == 0);
    for (int i = 0; i < lay.n; i++) {
        int on = 0;
        for (int s = 0; s < 2; s++)
            on += model_tensor_on_stage(&c, &lay.t[i], 2, s);
        if (lay.t[i].layer >= 0) {
            CHECK(on == 1);
            CHECK(model_tensor_on_stage(&c, &lay.t[i], 2, lay.t[i].layer < 25 ? 0 : 1));
        }
    }
    model_layout_free(&lay);
}

int main(void) {
    test_counts();
    test_stage_split();
    test_presets_valid();
    test_gpt2_layout();
    test_llama_layout();
    test_flops();
    test_lora_counts();
    test_check();
    return check_summary("test_model");
}
