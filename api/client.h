/* HTTP+JSON client used by loom-agent, loom-worker (rendezvous) and loomctl:
 * one libcurl easy handle per client, keep-alive, timeouts always set.
 * A client is used by one thread at a time; curl_global_init must have been
 * called once in main before threads start (client_global_init does it). */
#ifndef LOOM_API_CLIENT_H
#define LOOM_API_CLIENT_H

#include <jansson.h>

struct client;

/* Call once from main before any thread starts. */
void client_global_init(void);

/* base_url like "http://127.0.0.1:8420" or "https://..."; token may be NULL
 * (no Authorization header). Copies both strings. An https:// server's
 * certificate is verified against the PEM CA bundle named by $LOOM_CA, else
 * the system CAs. Returns NULL on allocation failure. */
struct client *client_new(const char *base_url, const char *token);
void client_free(struct client *c); /* accepts NULL */
/* Total per-request timeout in milliseconds (default 30000); connect timeout
 * is min(total, 5000). Long-polls set a longer total. */
void client_set_timeout_ms(struct client *c, long total_ms);
/* Extra request header such as "Idempotency-Key: abc" (NULL clears). */
void client_set_header(struct client *c, const char *header);

/* Sends `method path` with `body` (may be NULL; not stolen) as JSON.
 * On a transport success returns 0, sets *status to the HTTP status and
 * *out to the parsed JSON reply (caller owns it; NULL when the body is empty
 * or not JSON; raw text is then in *raw if raw is non-NULL, caller frees).
 * On a transport failure (connection refused, timeout) returns -1 with a
 * message in errbuf (may be NULL). */
int client_request(struct client *c, const char *method, const char *path, json_t *body,
                   long *status, json_t **out, char **raw, char *errbuf, size_t errlen);

/* The local address (numeric IPv4 or IPv6) of the connection the last
 * successful request used: the address of the interface through which this
 * host reaches the server. "" before any request. Borrowed; valid until the
 * next request or client_free. */
const char *client_local_ip(const struct client *c);

/* Convenience for error replies {"error":{"code","message"}}: returns the
 * message (borrowed from `reply`) or NULL. */
const char *client_error_message(json_t *reply);
const char *client_error_code(json_t *reply);

#endif
