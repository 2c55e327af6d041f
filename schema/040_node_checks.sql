-- Node checks (daemon/nodecheck.c, owner: ops): every check with its result
-- document, and the degraded marks that make the scheduler avoid a node.
-- Times are integer milliseconds since the Unix epoch (UTC).

CREATE TABLE node_checks (
    id          TEXT PRIMARY KEY,            -- "c-" + 12 hex
    kind        TEXT NOT NULL,               -- "node" (intra-node) or "pair" (two nodes)
    nodes       TEXT NOT NULL,               -- "node-a" or "node-a,node-b"
    state       TEXT NOT NULL,               -- queued, running, passed, degraded, failed
    created_at  INTEGER NOT NULL,
    finished_at INTEGER,
    doc         TEXT NOT NULL                -- the check as GET /v1/nodechecks/{id} shows it
);
CREATE INDEX node_checks_created ON node_checks(created_at);

CREATE TABLE node_health (
    node        TEXT NOT NULL,
    kind        TEXT NOT NULL,               -- which check kind set the mark
    degraded    INTEGER NOT NULL,
    reason      TEXT NOT NULL,
    check_id    TEXT NOT NULL,
    checked_at  INTEGER NOT NULL,
    PRIMARY KEY (node, kind)
);
