/* The audit log of loomd: every state-changing admin or tenant request (who:
 * token id and tenant; when; what: method, route, path and object id; from
 * which address; the status sent) is a row of the audit table (schema
 * 081_audit.sql), refused requests included. GET /v1/audit (admin) reads it;
 * rows older than --audit-retention-days are deleted at start-up and then
 * every hour (0 keeps them forever). */
#ifndef LOOM_DAEMON_AUDIT_H
#define LOOM_DAEMON_AUDIT_H

#include <stdint.h>

struct loomd;
struct http_req;

/* What the HTTP layer knows of a finished request. */
struct audit_event {
    const char *actor;     /* token id, "admin", or "" (no valid token) */
    const char *tenant_id; /* "" for the admin token */
    const char *method;
    const char *route; /* the route pattern */
    const char *path;
    const char *object_id; /* "" when none */
    const char *remote;    /* peer address text */
    int status;
};

/* 1 when a request of this method on this route is recorded. */
int audit_wanted(const char *method, const char *route_pattern, int route_auth);
/* Stores one row (a durable write); failures are logged, not returned. */
void audit_record(struct loomd *ld, const struct audit_event *e);
/* Deletes rows older than `days` days (0: none). Returns rows deleted, -1 on error. */
long audit_sweep(struct loomd *ld, long days);

/* Module: the hourly retention sweep (daemon/loomd.c modules table). */
int audit_start(struct loomd *ld);
void audit_stop(struct loomd *ld);

/* GET /v1/audit?since=&actor=&limit= (admin). */
int audit_api_list(struct http_req *req);

#endif
