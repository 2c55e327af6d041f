/* Job logs and metrics as shipped by the agents:
 *   GET /v1/jobs/{id}/logs?rank=R&attempt=A&stream=stderr|stdout&follow=1
 *     text/plain; default rank 0, the job's latest attempt that has logs,
 *     stream stderr (the worker's free text; stdout holds its JSON lines).
 *     follow=1 streams (chunked) while the job runs: it waits while the
 *     attempt is queued, moves on to the next attempt after a retry (a line
 *     "--- loom: attempt N ---" marks the switch) and ends a couple of
 *     seconds after the job finished and no more bytes arrive.
 *   GET /v1/jobs/{id}/metrics?rank=R
 *     {"job","rank","series":[step records + "attempt" + "util_pct"],
 *      "evals":[...]}; one entry per step (the newest attempt wins after a
 *     retry resumed from a checkpoint).
 * A tenant sees only its own jobs (404 otherwise); the admin sees all. */
#ifndef LOOM_DAEMON_JOBLOGS_H
#define LOOM_DAEMON_JOBLOGS_H

struct http_req;

int joblogs_logs(struct http_req *req);
int joblogs_metrics(struct http_req *req);

#endif
