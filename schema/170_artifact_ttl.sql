-- Artifact retention (daemon/artifacts.h): a tenant's own TTL in seconds after
-- a job ends, set by an admin (NULL: the cluster's --artifact-ttl; 0: never),
-- and when a job's checkpoints and exports were deleted for it (NULL: not yet).
ALTER TABLE tenants ADD COLUMN artifact_ttl_s INTEGER;
ALTER TABLE jobs ADD COLUMN artifacts_expired_at INTEGER;
CREATE INDEX jobs_artifacts_unexpired ON jobs(finished_at) WHERE artifacts_expired_at IS NULL;
