-- The tenant-scoped event stream (daemon/events.h): one row per typed event
-- (job.queued, job.started, ..., checkpoint.saved, export.ready), written in
-- the same transaction as the change it reports. seq is the replay cursor of
-- GET /v1/events (AUTOINCREMENT: never reused, even after the newest rows are
-- deleted). Times are integer milliseconds since the Unix epoch (UTC).
CREATE TABLE events (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    type        TEXT NOT NULL,
    job_id      TEXT NOT NULL,
    tenant_id   TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    data        TEXT NOT NULL DEFAULT '{}'   -- JSON object
);
CREATE INDEX events_tenant_seq ON events(tenant_id, seq);
CREATE INDEX events_job_seq ON events(job_id, seq);
