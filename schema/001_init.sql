-- Core tables of loomd: tenants, their API tokens (hashes only), jobs, the
-- job event history, job labels (for the label filter) and idempotency keys.
-- Times are integer milliseconds since the Unix epoch (UTC).

CREATE TABLE tenants (
    id          TEXT PRIMARY KEY,           -- "t-" + 12 hex
    name        TEXT NOT NULL UNIQUE,
    data_roots  TEXT NOT NULL DEFAULT '[]', -- JSON array of allowed data roots ([] = loomd default)
    gpu_quota   INTEGER NOT NULL DEFAULT 0, -- 0 = unlimited
    created_at  INTEGER NOT NULL
);

CREATE TABLE tokens (
    id          TEXT PRIMARY KEY,           -- "k-" + 12 hex
    tenant_id   TEXT NOT NULL REFERENCES tenants(id),
    hash        BLOB NOT NULL UNIQUE,       -- SHA-256 of the token text
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);
CREATE INDEX tokens_tenant ON tokens(tenant_id);

CREATE TABLE jobs (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT, -- insertion order; list cursor
    id             TEXT NOT NULL UNIQUE,              -- "j-" + 12 hex
    tenant_id      TEXT NOT NULL REFERENCES tenants(id),
    name           TEXT NOT NULL,
    state          TEXT NOT NULL,
    attempt        INTEGER NOT NULL DEFAULT 0,
    priority       INTEGER NOT NULL DEFAULT 50,
    max_retries    INTEGER NOT NULL DEFAULT 0,
    world_size     INTEGER NOT NULL DEFAULT 1,
    spec           TEXT NOT NULL,                     -- canonical spec JSON
    labels         TEXT NOT NULL DEFAULT '{}',        -- JSON object
    out_dir        TEXT NOT NULL DEFAULT '',
    pending_reason TEXT,
    placement      TEXT,                              -- JSON, set while starting/running
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    started_at     INTEGER,
    finished_at    INTEGER
);
CREATE INDEX jobs_tenant_seq ON jobs(tenant_id, seq);
CREATE INDEX jobs_tenant_state_seq ON jobs(tenant_id, state, seq);
CREATE INDEX jobs_tenant_name_seq ON jobs(tenant_id, name, seq);
CREATE INDEX jobs_state_seq ON jobs(state, seq);

CREATE TABLE job_labels (
    job_seq  INTEGER NOT NULL REFERENCES jobs(seq),
    key      TEXT NOT NULL,
    value    TEXT NOT NULL,
    PRIMARY KEY (key, value, job_seq)
) WITHOUT ROWID;

CREATE TABLE job_events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_seq    INTEGER NOT NULL REFERENCES jobs(seq),
    at         INTEGER NOT NULL,
    from_state TEXT,                                  -- NULL for the submit event
    to_state   TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    reason     TEXT NOT NULL
);
CREATE INDEX job_events_job ON job_events(job_seq, id);

CREATE TABLE idempotency (
    tenant_id    TEXT NOT NULL,
    key          TEXT NOT NULL,
    request_hash BLOB NOT NULL,                       -- SHA-256 of the canonical body
    job_id       TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, key)
) WITHOUT ROWID;
