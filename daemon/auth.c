/* Authentication: bootstrap tokens, tenant token hashing and lookup. Only
 * SHA-256 hashes are kept in memory and in the store; comparisons are
 * constant-time (token_equal_mem). */
#include "daemon/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/token.h"
#include "daemon/store.h"

#define CACHE_SLOTS 1024 /* direct-mapped by hash; a collision just evicts */
#define ROOTS_SLOTS 256

#define TOUCH_EVERY_MS 60000 /* last_used_at granularity */

struct cached_token {
    int used;
    unsigned char hash[32];
    struct auth_token_info info;
    int64_t touched_ms; /* last time last_used_at was written */
};

struct cached_roots {
    int used;
    char tenant[32];
    char *roots;
};

struct auth {
    unsigned char admin[32];
    unsigned char join[32];
    pthread_mutex_t mu;
    struct cached_token tokens[CACHE_SLOTS];
    struct cached_roots roots[ROOTS_SLOTS];
    unsigned long gen; /* bumped by auth_forget */
};

void auth_hash(const char *token, unsigned char out[32]) {
    unsigned int n = 32;
    EVP_Digest(token, strlen(token), out, &n, EVP_sha256(), NULL);
}

int auth_new_token(char *buf, size_t len) {
    if (len < 70) return -1;
    memcpy(buf, "loom_", 5);
    return token_hex(buf + 5, len - 5, 32);
}

/* Token from env `var`, else from data_dir/file, else a new one written to
 * that file with mode 0600. Hash into out. */
static int load_token(const char *data_dir, const char *var, const char *file,
                      unsigned char out[32]) {
    const char *env = getenv(var);
    if (env && *env) {
        auth_hash(env, out);
        return 0;
    }
    char path[4096], tok[256];
    snprintf(path, sizeof path, "%s/%s", data_dir, file);
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(tok, sizeof tok, f)) tok[0] = 0;
        fclose(f);
        tok[strcspn(tok, "\r\n")] = 0;
        if (!tok[0]) {
            log_error("auth: %s is empty", path);
            return -1;
        }
        auth_hash(tok, out);
        return 0;
    }
    if (auth_new_token(tok, sizeof tok) != 0) return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        log_error("auth: cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    size_t n = strlen(tok);
    tok[n] = '\n';
    int ok = write(fd, tok, n + 1) == (ssize_t)(n + 1) && fsync(fd) == 0;
    close(fd);
    tok[n] = 0;
    if (!ok) {
        log_error("auth: cannot write %s", path);
        return -1;
    }
    log_info("auth: generated %s (mode 0600)", path);
    auth_hash(tok, out);
    OPENSSL_cleanse(tok, sizeof tok);
    return 0;
}

struct auth *auth_new(const char *data_dir) {
    struct auth *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    pthread_mutex_init(&a->mu, NULL);
    if (load_token(data_dir, "LOOM_ADMIN_TOKEN", "admin.token", a->admin) != 0 ||
        load_token(data_dir, "LOOM_JOIN_TOKEN", "join.token", a->join) != 0) {
        free(a);
        return NULL;
    }
    return a;
}

void auth_free(struct auth *a) {
    if (!a) return;
    for (int i = 0; i < ROOTS_SLOTS; i++)
        free(a->roots[i].roots);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

void auth_forget(struct auth *a) {
    pthread_mutex_lock(&a->mu);
    memset(a->tokens, 0, sizeof a->tokens);
    for (int i = 0; i < ROOTS_SLOTS; i++) {
        free(a->roots[i].roots);
        a->roots[i].roots = NULL;
        a->roots[i].used = 0;
    }
    a->gen++;
    pthread_mutex_unlock(&a->mu);
}

int auth_is_admin(const struct auth *a, const char *token) {
    unsigned char h[32];
    auth_hash(token, h);
    return token_equal_mem(h, a->admin, 32);
}

int auth_is_join(const struct auth *a, const char *token) {
    unsigned char h[32];
    auth_hash(token, h);
    return token_equal_mem(h, a->join, 32);
}

struct lookup {
    unsigned char hash[32];
    struct store_token tok;
};

static int lookup_cb(struct store_tx *tx, void *arg) {
    struct lookup *l = arg;
    return store_token_find(tx, l->hash, &l->tok);
}

static int touch_cb(struct store_tx *tx, void *arg) {
    return store_token_touch(tx, arg, store_now_ms());
}

static unsigned slot_of(const unsigned char *h, unsigned n) {
    return ((unsigned)h[0] | (unsigned)h[1] << 8 | (unsigned)h[2] << 16) % n;
}

static int check_expiry(const struct auth_token_info *info) {
    return info->expires_at > 0 && store_now_ms() >= info->expires_at ? -3 : 0;
}

int auth_tenant_token(struct auth *a, struct store *s, const char *token,
                      struct auth_token_info *out) {
    struct lookup l;
    memset(&l, 0, sizeof l);
    auth_hash(token, l.hash);
    struct cached_token *c = &a->tokens[slot_of(l.hash, CACHE_SLOTS)];
    int64_t now = store_now_ms();
    pthread_mutex_lock(&a->mu);
    if (c->used && token_equal_mem(c->hash, l.hash, 32)) {
        *out = c->info;
        int touch = now - c->touched_ms >= TOUCH_EVERY_MS;
        if (touch) c->touched_ms = now;
        pthread_mutex_unlock(&a->mu);
        int rc = check_expiry(out);
        if (rc == 0 && touch) store_write(s, touch_cb, out->token_id);
        return rc;
    }
    unsigned long gen = a->gen;
    pthread_mutex_unlock(&a->mu);
    int rc = store_read(s, lookup_cb, &l);
    if (rc != STORE_OK) return rc == STORE_NOT_FOUND ? -1 : -2;
    memset(out, 0, sizeof *out);
    snprintf(out->tenant_id, sizeof out->tenant_id, "%s", l.tok.tenant_id);
    snprintf(out->token_id, sizeof out->token_id, "%s", l.tok.id);
    out->scopes = l.tok.scopes;
    out->expires_at = l.tok.expires_at;
    /* Cache only if no revocation finished meanwhile: a read that began
     * before a revocation committed may have seen the token live, and
     * auth_forget (after that commit) bumps gen, so it is not cached. */
    pthread_mutex_lock(&a->mu);
    if (a->gen == gen) {
        c->used = 1;
        memcpy(c->hash, l.hash, 32);
        c->info = *out;
        c->touched_ms = now;
    }
    pthread_mutex_unlock(&a->mu);
    rc = check_expiry(out);
    if (rc == 0) store_write(s, touch_cb, out->token_id);
    return rc;
}

int auth_tenant(struct auth *a, struct store *s, const char *token, char *tenant_id, size_t len) {
    struct auth_token_info info;
    int rc = auth_tenant_token(a, s, token, &info);
    if (rc == -3) return -1;
    if (rc == 0) snprintf(tenant_id, len, "%s", info.tenant_id);
    return rc;
}

static const struct {
    const char *name;
    unsigned bit;
} scope_names[] = {
    {"read", AUTH_SCOPE_READ},
    {"submit", AUTH_SCOPE_SUBMIT},
    {"admin", AUTH_SCOPE_ADMIN},
    {"metrics", AUTH_SCOPE_METRICS},
};
#define NSCOPES (sizeof scope_names / sizeof *scope_names)

unsigned auth_scope_parse(const char *name) {
    for (size_t i = 0; i < NSCOPES; i++)
        if (strcmp(scope_names[i].name, name) == 0) return scope_names[i].bit;
    return 0;
}

json_t *auth_scopes_json(unsigned scopes) {
    json_t *arr = json_array();
    for (size_t i = 0; i < NSCOPES; i++)
        if (scopes & scope_names[i].bit)
            json_array_append_new(arr, json_string(scope_names[i].name));
    return arr;
}

/* Routes that read although their method is not GET; every other non-GET
 * route of a tenant token needs submit. */
static const struct {
    const char *method;
    const char *pattern;
} read_writes[] = {
    {"POST", "/v1/plan"},
};

unsigned auth_route_scope(const char *method, const char *pattern) {
    if (strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0) return AUTH_SCOPE_READ;
    for (size_t i = 0; i < sizeof read_writes / sizeof *read_writes; i++)
        if (!strcmp(read_writes[i].method, method) && !strcmp(read_writes[i].pattern, pattern))
            return AUTH_SCOPE_READ;
    return AUTH_SCOPE_SUBMIT;
}

struct roots_lookup {
    const char *tenant;
    json_t *t;
};

static int roots_cb(struct store_tx *tx, void *arg) {
    struct roots_lookup *r = arg;
    return store_tenant_get(tx, r->tenant, &r->t);
}

int auth_tenant_roots(struct auth *a, struct store *s, const char *tenant_id, char *out,
                      size_t len) {
    unsigned h = 5381;
    for (const char *p = tenant_id; *p; p++)
        h = h * 33 + (unsigned char)*p;
    h %= ROOTS_SLOTS;
    struct cached_roots *c = &a->roots[h];
    pthread_mutex_lock(&a->mu);
    if (c->used && strcmp(c->tenant, tenant_id) == 0) {
        snprintf(out, len, "%s", c->roots);
        pthread_mutex_unlock(&a->mu);
        return 0;
    }
    pthread_mutex_unlock(&a->mu);
    struct roots_lookup r = {.tenant = tenant_id};
    int rc = store_read(s, roots_cb, &r);
    if (rc != STORE_OK) return rc == STORE_NOT_FOUND ? -1 : -2;
    char *text = json_dumps(json_object_get(r.t, "data_roots"), JSON_COMPACT);
    json_decref(r.t);
    if (!text) return -2;
    snprintf(out, len, "%s", text);
    pthread_mutex_lock(&a->mu);
    free(c->roots);
    c->roots = text;
    c->used = 1;
    snprintf(c->tenant, sizeof c->tenant, "%s", tenant_id);
    pthread_mutex_unlock(&a->mu);
    return 0;
}
