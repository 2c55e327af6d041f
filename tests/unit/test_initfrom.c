/* The spec's model object for a model whose shape comes from a source
 * (api/hf_config.c jobspec_model_from, used by loomd at submit and by the
 * worker) and the checkpoint steps loomd lists for a fork
 * (daemon/initfrom.c initfrom_list_steps), table-driven. The source is a
 * hand-written model_config, so the expected sizes are the literals below. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api/hf_config.h"
#include "daemon/initfrom.h"
#include "tests/check.h"

/* a Llama of 2 layers, 4 heads (2 kv), width 128, ffn 96, vocab 300, 128 positions */
static struct model_config llama(void) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, MODEL_LLAMA);
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_model = 128;
    c.d_ff = 96;
    c.vocab_size = 300;
    c.seq_len = 128;
    c.norm_eps = 1e-5;
    c.rope_theta = 500000.0;
    model_config_finalize(&c);
    return c;
}

static struct model_config gpt2(void) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    model_config_family_defaults(&c, MODEL_GPT2);
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 4;
    c.d_model = 64;
    c.d_ff = 256;
    c.vocab_size = 300;
    c.seq_len = 128;
    model_config_finalize(&c);
    return c;
}

static void test_model_from(void) {
    static const struct {
        const char *name;
        int gpt2;
        const char *model; /* the spec's "model" */
        const char *code;  /* NULL: accepted */
        const char *names; /* accepted: "key=value" checks; refused: text the message names */
    } cases[] = {
        {"init_from only", 0, "{\"init_from\":\"/m\"}", NULL,
         "family=llama n_layer=2 n_head=4 n_kv_head=2 d_model=128 d_ff=96 vocab_size=300 "
         "seq_len=128"},
        {"seq_len kept", 0, "{\"init_from\":\"/m\",\"seq_len\":32}", NULL, "seq_len=32"},
        {"agreeing sizes", 0, "{\"family\":\"llama\",\"n_layer\":2,\"d_ff\":96,\"norm_eps\":1e-5}",
         NULL, "n_layer=2"},
        {"float32 eps agrees", 0, "{\"norm_eps\":9.999999747378752e-06}", NULL, "d_model=128"},
        {"unknown key kept for the parser", 0, "{\"n_layerz\":3}", NULL, "n_layerz=3"},
        {"source keys dropped", 0, "{\"init_checkpoint\":\"/x\",\"init_hf\":\"/y\"}", NULL,
         "init_checkpoint=absent init_hf=absent init_from=absent"},
        {"n_layer", 0, "{\"n_layer\":3}", "INIT_FROM_MISMATCH", "model.n_layer=3|n_layer=2|SRC"},
        {"n_kv_head", 0, "{\"n_kv_head\":4}", "INIT_FROM_MISMATCH", "n_kv_head=4|n_kv_head=2"},
        {"vocab", 0, "{\"vocab_size\":301}", "INIT_FROM_MISMATCH", "vocab_size=301|vocab_size=300"},
        {"tied", 0, "{\"tied_embeddings\":true}", "INIT_FROM_MISMATCH", "tied_embeddings=true"},
        {"theta", 0, "{\"rope_theta\":10000}", "INIT_FROM_MISMATCH", "rope_theta=10000|500000"},
        {"family", 0, "{\"family\":\"gpt2\"}", "INIT_FROM_MISMATCH", "family=gpt2|family=llama"},
        {"preset", 0, "{\"family\":\"llama\",\"preset\":\"tiny\"}", "INIT_FROM_MISMATCH",
         "preset tiny"},
        {"unknown preset", 0, "{\"preset\":\"huge9\"}", "UNKNOWN_PRESET", "huge9"},
        {"too long", 0, "{\"seq_len\":129}", "HF_CONFIG_UNSUPPORTED", "129|128"},
        {"gpt2 positions", 1, "{\"seq_len\":64}", "HF_CONFIG_UNSUPPORTED", "must be 128"},
        {"gpt2 default", 1, "{}", NULL, "family=gpt2 seq_len=128 rope_theta=absent"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct model_config c = cases[i].gpt2 ? gpt2() : llama();
        struct hf_model_source src;
        hf_model_source_init(&src, &c, "SRC");
        json_t *in = json_loads(cases[i].model, 0, NULL);
        struct loom_error e;
        memset(&e, 0, sizeof e);
        json_t *m = jobspec_model_from(&src, in, &e);
        if (cases[i].code) {
            CHECK(!m && strcmp(e.code, cases[i].code) == 0, "%s: got %s (%s), want %s",
                  cases[i].name, m ? "accepted" : e.code, e.message, cases[i].code);
            char want[256];
            snprintf(want, sizeof want, "%s", cases[i].names);
            for (char *save = NULL, *t = strtok_r(want, "|", &save); t;
                 t = strtok_r(NULL, "|", &save))
                CHECK(strstr(e.message, t) != NULL, "%s: message lacks '%s': %s", cases[i].name, t,
                      e.message);
        } else {
            CHECK(m != NULL, "%s: %s %s", cases[i].name, e.code, e.message);
            char want[256];
            snprintf(want, sizeof want, "%s", cases[i].names);
            for (char *save = NULL, *t = strtok_r(want, " ", &save); m && t;
                 t = strtok_r(NULL, " ", &save)) {
                char *eq = strchr(t, '=');
                *eq = '\0';
                json_t *v = json_object_get(m, t);
                char got[64] = "absent";
                if (json_is_string(v)) snprintf(got, sizeof got, "%s", json_string_value(v));
                if (json_is_integer(v))
                    snprintf(got, sizeof got, "%lld", (long long)json_integer_value(v));
                CHECK(strcmp(got, eq + 1) == 0, "%s: %s=%s, want %s", cases[i].name, t, got,
                      eq + 1);
            }
        }
        json_decref(m);
        json_decref(in);
    }
}

static void mk(const char *root, const char *rel, int manifest) {
    char p[512];
    snprintf(p, sizeof p, "%s/checkpoints/%s", root, rel);
    CHECK(mkdir(p, 0755) == 0, "mkdir %s", p);
    if (!manifest) return;
    snprintf(p, sizeof p, "%s/checkpoints/%s/manifest.json", root, rel);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
}

static void test_list_steps(void) {
    char dir[] = "/tmp/loom_test_initfrom_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    long long steps[8];
    CHECK(initfrom_list_steps(dir, steps, 8) == 0, "no checkpoints directory: none");
    char p[512];
    snprintf(p, sizeof p, "%s/checkpoints", dir);
    CHECK(mkdir(p, 0755) == 0);
    mk(dir, "step_00000200", 1);
    mk(dir, "step_00000010", 1);
    mk(dir, "step_00001000", 1);
    mk(dir, "step_00000300", 0);      /* no manifest: not complete */
    mk(dir, ".tmp.step_00000400", 1); /* a save in progress */
    mk(dir, "step_x", 1);
    int n = initfrom_list_steps(dir, steps, 8);
    CHECK(n == 3 && steps[0] == 10 && steps[1] == 200 && steps[2] == 1000,
          "steps: n=%d %lld %lld %lld", n, steps[0], steps[1], steps[2]);
    CHECK(initfrom_list_steps(dir, steps, 2) == 3, "the count past max");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
    test_model_from();
    test_list_steps();
    return check_summary("test_initfrom");
}
