/* Per-tenant token buckets in an open-addressing table keyed by tenant id.
 * Tenants are few (tens to hundreds); the table grows by doubling. */
#include "daemon/ratelimit.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/hash.h"

struct bucket {
    char *key;
    double tokens;
    double last; /* monotonic seconds */
};

struct ratelimit {
    pthread_mutex_t mu;
    double rate, burst;
    struct bucket *slots;
    size_t cap, used;
};

struct ratelimit *ratelimit_new(double rate, double burst) {
    struct ratelimit *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    r->rate = rate;
    r->burst = burst < 1 ? 1 : burst;
    r->cap = 64;
    r->slots = calloc(r->cap, sizeof *r->slots);
    if (!r->slots) {
        free(r);
        return NULL;
    }
    return r;
}

void ratelimit_free(struct ratelimit *r) {
    if (!r) return;
    for (size_t i = 0; i < r->cap; i++)
        free(r->slots[i].key);
    free(r->slots);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static struct bucket *find(struct bucket *slots, size_t cap, const char *key) {
    size_t i = loom_fnv1a_str(key) & (cap - 1);
    while (slots[i].key && strcmp(slots[i].key, key) != 0)
        i = (i + 1) & (cap - 1);
    return &slots[i];
}

static int grow(struct ratelimit *r) {
    size_t cap = r->cap * 2;
    struct bucket *s = calloc(cap, sizeof *s);
    if (!s) return -1;
    for (size_t i = 0; i < r->cap; i++)
        if (r->slots[i].key) *find(s, cap, r->slots[i].key) = r->slots[i];
    free(r->slots);
    r->slots = s;
    r->cap = cap;
    return 0;
}

int ratelimit_allow(struct ratelimit *r, const char *key, double *retry_after_s) {
    if (r->rate <= 0) return 1;
    int ok = 1;
    pthread_mutex_lock(&r->mu);
    double t = clock_mono_s();
    struct bucket *b = find(r->slots, r->cap, key);
    if (!b->key) {
        if ((r->used + 1) * 2 > r->cap && grow(r) == 0) b = find(r->slots, r->cap, key);
        b->key = strdup(key);
        if (!b->key) goto out; /* out of memory: do not limit */
        b->tokens = r->burst;
        b->last = t;
        r->used++;
    }
    b->tokens += (t - b->last) * r->rate;
    if (b->tokens > r->burst) b->tokens = r->burst;
    b->last = t;
    if (b->tokens >= 1) {
        b->tokens -= 1;
    } else {
        ok = 0;
        if (retry_after_s) *retry_after_s = (1 - b->tokens) / r->rate;
    }
out:
    pthread_mutex_unlock(&r->mu);
    return ok;
}
