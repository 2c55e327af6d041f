-- The audit log (daemon/audit.h): one row per state-changing admin or tenant
-- request (any method but GET/HEAD on an admin, tenant or any-token route,
-- POST /v1/plan excepted), refused ones included. actor is the token id
-- ("admin" for the admin token, "" when no valid token was sent); route is
-- the route pattern, path the request path, object_id the object acted on
-- (path id or the created object's id); remote the peer address; status the
-- HTTP status sent. Rows older than --audit-retention-days are deleted.

CREATE TABLE audit (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,           -- ms since the Unix epoch
    actor      TEXT NOT NULL,
    tenant_id  TEXT NOT NULL DEFAULT '',
    method     TEXT NOT NULL,
    route      TEXT NOT NULL,
    path       TEXT NOT NULL,
    object_id  TEXT NOT NULL DEFAULT '',
    remote     TEXT NOT NULL DEFAULT '',
    status     INTEGER NOT NULL
);
CREATE INDEX audit_at ON audit(at);
CREATE INDEX audit_actor ON audit(actor, seq);
