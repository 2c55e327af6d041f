/* Per-tenant rate limit: a token bucket per tenant id (rate per second,
 * burst), kept in a small hash table under a mutex. Thread-safe. */
#ifndef LOOM_DAEMON_RATELIMIT_H
#define LOOM_DAEMON_RATELIMIT_H

struct ratelimit;

/* rate <= 0 disables limiting (every call allowed). */
struct ratelimit *ratelimit_new(double rate, double burst);
void ratelimit_free(struct ratelimit *r);
/* 1 if `key` may make one more request now, 0 if over the limit; when 0,
 * *retry_after_s (if non-NULL) gets the seconds until a token is free. */
int ratelimit_allow(struct ratelimit *r, const char *key, double *retry_after_s);

#endif
