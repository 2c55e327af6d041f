/* config.json -> model_config for the Hugging Face architectures (worker/hf.c
 * hf_config_parse), table-driven: defaults, alternative keys, the features
 * each architecture adds, and every refusal with its code; plus the llama3
 * RoPE frequencies (api/model.c model_rope_inv_freq) against values of the
 * transformers formula computed independently (tests/hf/ref_forward.py's
 * inv_freq in float64). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/check.h"
#include "worker/hf.h"

static char dir[256];

struct want {
    int family, n_layer, n_head, n_kv_head, d_model, d_ff, vocab, seq, tied, qkv_bias, scaling;
    double eps, theta;
};

static const struct {
    const char *name, *json;
    const char *code; /* NULL: parses */
    struct want w;
} cases[] = {
    {"llama defaults",
     "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":300}",
     NULL,
     {MODEL_LLAMA, 2, 4, 4, 64, 96, 300, 2048, 0, 0, 0, 1e-6, 10000.0}},
    {"llama 3.2 style",
     "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
     "\"vocab_size\":300,\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-5,"
     "\"rope_theta\":500000.0,\"tie_word_embeddings\":true,\"head_dim\":16,\"rope_scaling\":"
     "{\"rope_type\":\"llama3\",\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
     "\"original_max_position_embeddings\":8192}}",
     NULL,
     {MODEL_LLAMA, 2, 4, 2, 64, 96, 300, 131072, 1, 0, MODEL_ROPE_SCALE_LLAMA3, 1e-5, 500000.0}},
    {"model_type only, rope_type default",
     "{\"model_type\":\"llama\",\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"vocab_size\":300,"
     "\"rope_scaling\":{\"rope_type\":\"default\"}}",
     NULL,
     {MODEL_LLAMA, 1, 4, 4, 64, 96, 300, 2048, 0, 0, 0, 1e-6, 10000.0}},
    {"mistral sliding window caps seq_len",
     "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":1,"
     "\"vocab_size\":300,\"max_position_embeddings\":32768,\"sliding_window\":4096}",
     NULL,
     {MODEL_LLAMA, 2, 4, 1, 64, 96, 300, 4096, 0, 0, 0, 1e-6, 10000.0}},
    {"qwen2 biases",
     "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
     "\"vocab_size\":300,\"rope_theta\":1000000.0,\"tie_word_embeddings\":true,"
     "\"use_sliding_window\":false,\"sliding_window\":64}",
     NULL,
     {MODEL_LLAMA, 2, 4, 2, 64, 96, 300, 2048, 1, 1, 0, 1e-6, 1e6}},
    {"gpt2 n_ctx and null n_inner",
     "{\"architectures\":[\"GPT2LMHeadModel\"],\"n_embd\":64,\"n_layer\":2,\"n_head\":4,"
     "\"vocab_size\":300,\"n_ctx\":128,\"n_inner\":null,\"activation_function\":\"gelu_new\"}",
     NULL,
     {MODEL_GPT2, 2, 4, 4, 64, 256, 300, 128, 1, 0, 0, 1e-5, 0}},
    {"unsupported architecture",
     "{\"architectures\":[\"FalconForCausalLM\"]}",
     "UNSUPPORTED_ARCHITECTURE",
     {0}},
    {"no architecture", "{\"hidden_size\":64}", "UNSUPPORTED_ARCHITECTURE", {0}},
    {"missing size",
     "{\"architectures\":[\"LlamaForCausalLM\"],\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":300}",
     "HF_CONFIG_INVALID",
     {0}},
    {"size of the wrong type",
     "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":\"64\",\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":300}",
     "HF_CONFIG_INVALID",
     {0}},
    {"heads do not divide",
     "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":5,\"vocab_size\":300}",
     "HF_CONFIG_INVALID",
     {0}},
    {"head_dim differs",
     "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":300,\"head_dim\":32}",
     "HF_CONFIG_UNSUPPORTED",
     {0}},
    {"linear rope scaling",
     "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":300,"
     "\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}",
     "HF_CONFIG_UNSUPPORTED",
     {0}},
    {"llama3 scaling without factor",
     "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":300,"
     "\"rope_scaling\":{\"rope_type\":\"llama3\",\"low_freq_factor\":1.0,"
     "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}",
     "HF_CONFIG_INVALID",
     {0}},
    {"attention bias",
     "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":300,"
     "\"attention_bias\":true}",
     "HF_CONFIG_UNSUPPORTED",
     {0}},
    {"gelu activation for llama",
     "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":300,"
     "\"hidden_act\":\"gelu\"}",
     "HF_CONFIG_UNSUPPORTED",
     {0}},
    {"qwen2 sliding window on",
     "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
     "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":300,"
     "\"use_sliding_window\":true}",
     "HF_CONFIG_UNSUPPORTED",
     {0}},
    {"gpt2 relu",
     "{\"architectures\":[\"GPT2LMHeadModel\"],\"n_embd\":64,\"n_layer\":2,"
     "\"n_head\":4,\"vocab_size\":300,\"activation_function\":\"relu\"}",
     "HF_CONFIG_UNSUPPORTED",
     {0}},
    {"not an object", "[1, 2]", "HF_CONFIG_INVALID", {0}},
};

static void test_configs(void) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[300];
        snprintf(path, sizeof path, "%s/config%zu.json", dir, i);
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        if (!f) continue;
        fputs(cases[i].json, f);
        fclose(f);
        struct model_config c;
        enum hf_arch a;
        struct loom_error e;
        memset(&e, 0, sizeof e);
        int rc = hf_config_parse(path, &c, &a, &e);
        if (cases[i].code) {
            CHECK(rc != 0 && strcmp(e.code, cases[i].code) == 0 && strstr(e.message, path),
                  "%s: rc %d code %s (%s), want %s", cases[i].name, rc, e.code, e.message,
                  cases[i].code);
            continue;
        }
        const struct want *w = &cases[i].w;
        CHECK(rc == 0, "%s: %s %s", cases[i].name, e.code, e.message);
        if (rc) continue;
        int ok = (int)c.family == w->family && c.n_layer == w->n_layer && c.n_head == w->n_head &&
                 c.n_kv_head == w->n_kv_head && c.d_model == w->d_model && c.d_ff == w->d_ff &&
                 c.vocab_size == w->vocab && c.seq_len == w->seq && c.tied_embeddings == w->tied &&
                 c.qkv_bias == w->qkv_bias && c.rope_scaling == w->scaling &&
                 c.norm_eps == w->eps && c.rope_theta == w->theta && c.padded_vocab == 384;
        CHECK(ok,
              "%s: got family %d L %d H %d/%d C %d F %d V %d seq %d tied %d bias %d scale %d eps "
              "%g theta %g",
              cases[i].name, c.family, c.n_layer, c.n_head, c.n_kv_head, c.d_model, c.d_ff,
              c.vocab_size, c.seq_len, c.tied_embeddings, c.qkv_bias, c.rope_scaling, c.norm_eps,
              c.rope_theta);
    }
}

/* Llama 3.2's rope_scaling (factor 32, low 1, high 4, original 8192, theta
 * 500000, head dim 64): high frequencies kept, low ones divided by 32, the
 * band between interpolated. Expected values from the transformers formula
 * in float64 (tests/hf/ref_forward.py inv_freq). */
static void test_llama3_freqs(void) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.rope_theta = 500000.0;
    c.rope_scaling = MODEL_ROPE_SCALE_LLAMA3;
    c.rope_factor = 32.0;
    c.rope_low_freq_factor = 1.0;
    c.rope_high_freq_factor = 4.0;
    c.rope_original_max_pos = 8192;
    static const struct {
        int d;
        double want;
    } v[] = {{0, 1.0},
             {10, 0.016560440080994446},
             {16, 0.00042955679655936815},
             {20, 8.570255489881478e-06},
             {24, 1.661967467795309e-06},
             {31, 9.418306725434909e-08}};
    double inv[32];
    model_rope_inv_freq(&c, 64, inv);
    for (size_t i = 0; i < sizeof v / sizeof *v; i++)
        CHECK_NEAR(inv[v[i].d] / v[i].want, 1.0, 1e-12);
    c.rope_scaling = MODEL_ROPE_SCALE_NONE; /* plain theta^(-2d/HD) */
    model_rope_inv_freq(&c, 64, inv);
    CHECK_NEAR(inv[31] / 3.013858152139171e-06, 1.0, 1e-12);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/loom_test_hf_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_configs();
    test_llama3_freqs();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_hf_config");
}
