/* Authentication: bootstrap tokens, tenant token hashing and lookup. Only
 * SHA-256 hashes are kept in memory and in the store; comparisons are
 * constant-time (CRYPTO_memcmp). */
#include "daemon/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/store.h"

struct auth {
    unsigned char admin[32];
    unsigned char join[32];
};

void auth_hash(const char *token, unsigned char out[32]) {
    unsigned int n = 32;
    EVP_Digest(token, strlen(token), out, &n, EVP_sha256(), NULL);
}

int auth_new_token(char *buf, size_t len) {
    unsigned char r[32];
    if (len < 70 || RAND_bytes(r, sizeof r) != 1) return -1;
    int n = snprintf(buf, len, "loom_");
    for (size_t i = 0; i < sizeof r; i++)
        n += snprintf(buf + n, len - (size_t)n, "%02x", r[i]);
    return 0;
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
    if (load_token(data_dir, "LOOM_ADMIN_TOKEN", "admin.token", a->admin) != 0 ||
        load_token(data_dir, "LOOM_JOIN_TOKEN", "join.token", a->join) != 0) {
        free(a);
        return NULL;
    }
    return a;
}

void auth_free(struct auth *a) {
    free(a);
}

int auth_is_admin(const struct auth *a, const char *token) {
    unsigned char h[32];
    auth_hash(token, h);
    return CRYPTO_memcmp(h, a->admin, 32) == 0;
}

int auth_is_join(const struct auth *a, const char *token) {
    unsigned char h[32];
    auth_hash(token, h);
    return CRYPTO_memcmp(h, a->join, 32) == 0;
}

struct lookup {
    unsigned char hash[32];
    char *tenant;
    size_t len;
};

static int lookup_cb(struct store_tx *tx, void *arg) {
    struct lookup *l = arg;
    return store_token_lookup(tx, l->hash, l->tenant, l->len);
}

int auth_tenant(struct store *s, const char *token, char *tenant_id, size_t len) {
    struct lookup l = {.tenant = tenant_id, .len = len};
    auth_hash(token, l.hash);
    int rc = store_read(s, lookup_cb, &l);
    return rc == STORE_OK ? 0 : rc == STORE_NOT_FOUND ? -1 : -2;
}
