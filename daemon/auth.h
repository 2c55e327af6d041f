/* Authentication: the bootstrap admin token and the agents' join token (from
 * LOOM_ADMIN_TOKEN / LOOM_JOIN_TOKEN, else generated once into
 * <data-dir>/admin.token and join.token with mode 0600), tenant API tokens
 * (random, shown once, stored as SHA-256), and constant-time checks.
 * Thread-safe after auth_new. */
#ifndef LOOM_DAEMON_AUTH_H
#define LOOM_DAEMON_AUTH_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct auth;
struct store;

/* Loads or creates the admin and join tokens under data_dir. NULL on error (logged). */
struct auth *auth_new(const char *data_dir);
void auth_free(struct auth *a);

/* SHA-256 of `token` into out. */
void auth_hash(const char *token, unsigned char out[32]);
/* Fills buf (>= 70 bytes) with a new random token "loom_<64 hex>". 0 or -1. */
int auth_new_token(char *buf, size_t len);

/* Token scopes (bits; stored in tokens.scopes): read = GET routes and
 * POST /v1/plan, submit = the other tenant writes (submit, cancel), admin =
 * the admin routes, metrics = the full GET /metrics and nothing else; admin
 * and metrics for tokens of the tenant named AUTH_ADMIN_TENANT only. */
enum auth_scope {
    AUTH_SCOPE_READ = 1,
    AUTH_SCOPE_SUBMIT = 2,
    AUTH_SCOPE_ADMIN = 4,
    AUTH_SCOPE_METRICS = 8, /* GET /metrics with per-job and per-tenant series (Prometheus) */
};
#define AUTH_SCOPES_DEFAULT (AUTH_SCOPE_READ | AUTH_SCOPE_SUBMIT)
#define AUTH_ADMIN_TENANT   "admin"
/* The bit of a scope name, or 0 when unknown. */
unsigned auth_scope_parse(const char *name);
/* The names of the bits as a JSON array (new reference). */
json_t *auth_scopes_json(unsigned scopes);
/* The scope a tenant token needs for a route of this method and pattern. */
unsigned auth_route_scope(const char *method, const char *pattern);

/* A tenant token found by auth_tenant_token. */
struct auth_token_info {
    char tenant_id[32];
    char token_id[32];
    unsigned scopes;
    int64_t expires_at; /* ms, 0: never */
};

int auth_is_admin(const struct auth *a, const char *token);
int auth_is_join(const struct auth *a, const char *token);
/* Looks up a tenant token: 0 and tenant id, or -1 (unknown or revoked), -2
 * store error. Valid tokens are cached in memory (hash -> tenant) so the hot
 * path needs no store read; auth_forget() drops the cache (call after any
 * revocation, before replying). */
int auth_tenant(struct auth *a, struct store *s, const char *token, char *tenant_id, size_t len);
/* As auth_tenant with the token's id, scopes and expiry: 0 live, -1 unknown
 * or revoked, -2 store error, -3 expired (*out filled). A successful use is
 * recorded in tokens.last_used_at at most once a minute per token. */
int auth_tenant_token(struct auth *a, struct store *s, const char *token,
                      struct auth_token_info *out);
void auth_forget(struct auth *a); /* also drops cached tenant data_roots */
/* The tenant's data_roots as JSON array text into out (cached; tenants'
 * roots do not change). 0, -1 unknown tenant, -2 store error. */
int auth_tenant_roots(struct auth *a, struct store *s, const char *tenant_id, char *out,
                      size_t len);

#endif
