/* Benchmark of the api/ hot paths that loomd runs per request: job-spec
 * parse + validate + canonical dump (every POST /v1/jobs), the planner's fit
 * check (every submit), and a full recommendation (POST /v1/plan).
 * Not a test; prints per-call times. Usage: bench_api [iterations] */
#include "api/jobspec.h"
#include "api/planner.h"
#include "common/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *spec_text =
    "{\"name\":\"gpt2-small\",\"labels\":{\"team\":\"nlp\"},"
    "\"model\":{\"family\":\"gpt2\",\"preset\":\"124m\"},"
    "\"data\":{\"train\":\"/data/fineweb/train_*.bin\",\"val\":\"/data/fineweb/val_000.bin\"},"
    "\"parallel\":{\"dp\":2,\"tp\":1,\"pp\":1,\"zero_stage\":1},"
    "\"train\":{\"steps\":1000,\"global_batch_tokens\":524288,\"micro_batch\":16,\"lr\":6e-4,"
    "\"min_lr\":6e-5,\"warmup_steps\":100,\"schedule\":\"cosine\",\"weight_decay\":0.1,"
    "\"grad_clip\":1.0,\"seed\":42,\"precision\":\"bf16\",\"recompute\":\"none\","
    "\"offload_optimizer\":false},\"checkpoint\":{\"every_steps\":200,\"keep\":3},"
    "\"resources\":{\"device\":\"cuda\",\"gpus_per_node\":8},\"priority\":50,\"max_retries\":3}";

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20000;
    struct loom_spec s;
    struct loom_error e;
    double t0 = clock_mono_s();
    for (int i = 0; i < iters; i++) {
        if (jobspec_parse_text(&s, spec_text, strlen(spec_text), 0, &e) != 0) {
            fprintf(stderr, "parse: %s\n", e.message);
            return 1;
        }
        free(jobspec_dumps(&s));
    }
    double t1 = clock_mono_s();
    printf("jobspec parse+validate+dump: %.1f us/call\n", (t1 - t0) / iters * 1e6);

    struct planner_cluster c;
    planner_cluster_default(&c);
    t0 = clock_mono_s();
    for (int i = 0; i < iters; i++)
        if (planner_check_fit(&s, &c, NULL, &e) != 0) {
            fprintf(stderr, "fit: %s\n", e.message);
            return 1;
        }
    t1 = clock_mono_s();
    printf("planner_check_fit gpt2-124m (fits): %.1f us/call\n", (t1 - t0) / iters * 1e6);

    static const struct {
        const char *what, *spec;
        int nodes;
    } recs[] = {
        {"gpt2 124m, 1 node", "{\"model\":{\"family\":\"gpt2\",\"preset\":\"124m\"}}", 1},
        {"llama 70b, 8 nodes",
         "{\"model\":{\"family\":\"llama\",\"preset\":\"70b\"},\"train\":{\"micro_batch\":1,"
         "\"global_batch_tokens\":4194304}}",
         8},
        {"llama 405b, 32 nodes",
         "{\"model\":{\"family\":\"llama\",\"preset\":\"405b\"},\"train\":{\"micro_batch\":1,"
         "\"global_batch_tokens\":4194304}}",
         32},
    };
    for (size_t k = 0; k < sizeof recs / sizeof *recs; k++) {
        if (jobspec_parse_text(&s, recs[k].spec, strlen(recs[k].spec), JOBSPEC_FOR_PLAN, &e)) {
            fprintf(stderr, "%s\n", e.message);
            return 1;
        }
        c.nodes = recs[k].nodes;
        int reps = 5, n = 0;
        t0 = clock_mono_s();
        for (int i = 0; i < reps; i++) {
            struct planner_candidate *list;
            if (planner_recommend(&s, &c, NULL, &list, &n, &e) != 0) return 1;
            free(list);
        }
        t1 = clock_mono_s();
        printf("planner_recommend %-22s %4d layouts, %.1f ms/call\n", recs[k].what, n,
               (t1 - t0) / reps * 1e3);
    }
    return 0;
}
