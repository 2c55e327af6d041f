/* The agent's artifact server (agent/artifacts.c says what it serves and
 * how it confines paths): loomd proxies artifact downloads to it when job
 * directories live on the nodes' own disks (--job-root). */
#ifndef LOOM_AGENT_ARTIFACTS_H
#define LOOM_AGENT_ARTIFACTS_H

struct agent_artifacts;

/* Starts serving <job_root>/<job>/... on listen ("HOST:PORT", port 0: any)
 * to bearers of a new random token. NULL on failure (logged). */
struct agent_artifacts *agent_artifacts_start(const char *listen, const char *job_root);
/* The token loomd must present (64 hex digits; reported at registration). */
const char *agent_artifacts_token(const struct agent_artifacts *s);
/* The bound port (for the URL reported at registration). */
int agent_artifacts_port(const struct agent_artifacts *s);
/* Stops the server; accepts NULL. */
void agent_artifacts_stop(struct agent_artifacts *s);

#endif
