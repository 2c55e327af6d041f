-- Cluster state owned by the agent/scheduler area: nodes (drain flag and
-- last known inventory survive a loomd restart), attempts (placement and the
-- attempt-scoped rendezvous token, so running attempts continue after a
-- restart), per-step metrics shipped by agents, and the usage ledger.
-- Times are integer milliseconds since the Unix epoch (UTC).

CREATE TABLE nodes (
    name        TEXT PRIMARY KEY,            -- node id = the agent's --name
    kind        TEXT NOT NULL,               -- "cuda" or "cpu"
    devices     TEXT NOT NULL DEFAULT '[]',  -- JSON inventory at registration
    drained     INTEGER NOT NULL DEFAULT 0,
    hostname    TEXT NOT NULL DEFAULT '',
    registered_at INTEGER NOT NULL,
    last_seen   INTEGER NOT NULL
);

CREATE TABLE attempts (
    job_id      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    tenant_id   TEXT NOT NULL,
    state       TEXT NOT NULL,               -- active | succeeded | failed | cancelled
    token_hash  TEXT NOT NULL,               -- hex SHA-256 of the rendezvous token
    token       TEXT NOT NULL,               -- the token itself (agents need it after a restart)
    placement   TEXT NOT NULL,               -- JSON [{"rank","node","device","local_rank"}]
    world       INTEGER NOT NULL,
    started_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    reason      TEXT,
    PRIMARY KEY (job_id, attempt)
) WITHOUT ROWID;
CREATE INDEX attempts_state ON attempts(state);

CREATE TABLE job_metrics (
    job_id      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    rank        INTEGER NOT NULL,
    step        INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    record      TEXT NOT NULL,               -- the worker's step JSON line (+ util_pct)
    PRIMARY KEY (job_id, rank, step, attempt)
) WITHOUT ROWID;

CREATE TABLE usage (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id   TEXT NOT NULL,
    job_id      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    node        TEXT NOT NULL,
    gpu_model   TEXT NOT NULL,
    gpus        INTEGER NOT NULL,
    start_ms    INTEGER NOT NULL,
    end_ms      INTEGER NOT NULL,
    gpu_seconds REAL NOT NULL,
    cost        REAL NOT NULL
);
CREATE INDEX usage_tenant_start ON usage(tenant_id, start_ms);
CREATE INDEX usage_start ON usage(start_ms);

-- Rendezvous keys of active attempts, so a loomd restart in the middle of a
-- rendezvous does not strand the ranks still waiting for a key.
CREATE TABLE rdzv_keys (
    job_id      TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,               -- the JSON value as sent
    PRIMARY KEY (job_id, attempt, key)
) WITHOUT ROWID;
