/* Authentication: the bootstrap admin token and the agents' join token (from
 * LOOM_ADMIN_TOKEN / LOOM_JOIN_TOKEN, else generated once into
 * <data-dir>/admin.token and join.token with mode 0600), tenant API tokens
 * (random, shown once, stored as SHA-256), and constant-time checks.
 * Thread-safe after auth_new. */
#ifndef LOOM_DAEMON_AUTH_H
#define LOOM_DAEMON_AUTH_H

#include <stddef.h>

struct auth;
struct store;

/* Loads or creates the admin and join tokens under data_dir. NULL on error (logged). */
struct auth *auth_new(const char *data_dir);
void auth_free(struct auth *a);

/* SHA-256 of `token` into out. */
void auth_hash(const char *token, unsigned char out[32]);
/* Fills buf (>= 70 bytes) with a new random token "loom_<64 hex>". 0 or -1. */
int auth_new_token(char *buf, size_t len);

int auth_is_admin(const struct auth *a, const char *token);
int auth_is_join(const struct auth *a, const char *token);
/* Looks up a tenant token: 0 and tenant id, or -1 (unknown or revoked), -2
 * store error. Valid tokens are cached in memory (hash -> tenant) so the hot
 * path needs no store read; auth_forget() drops the cache (call after any
 * revocation, before replying). */
int auth_tenant(struct auth *a, struct store *s, const char *token, char *tenant_id, size_t len);
void auth_forget(struct auth *a); /* also drops cached tenant data_roots */
/* The tenant's data_roots as JSON array text into out (cached; tenants'
 * roots do not change). 0, -1 unknown tenant, -2 store error. */
int auth_tenant_roots(struct auth *a, struct store *s, const char *tenant_id, char *out,
                      size_t len);

#endif
