-- SHA-256 of artifact files (daemon/artifacts.h), computed once per file
-- version (size + mtime) and reused by listings, downloads (ETag) and restarts.
CREATE TABLE artifact_hashes (
    job_id      TEXT NOT NULL,
    path        TEXT NOT NULL,               -- relative to the job's artifact root
    size        INTEGER NOT NULL,
    mtime_ns    INTEGER NOT NULL,
    sha256      TEXT NOT NULL,
    PRIMARY KEY (job_id, path)
) WITHOUT ROWID;
