-- Per-tenant quality of service, set by the admin (PATCH /v1/tenants/{id}):
-- the highest priority a job may ask for, how many jobs may run at once and
-- the GPU-hours a calendar month (UTC) may use before new jobs are refused.
-- The defaults mean "no limit".

ALTER TABLE tenants ADD COLUMN max_priority INTEGER NOT NULL DEFAULT -1;        -- -1: none
ALTER TABLE tenants ADD COLUMN max_running_jobs INTEGER NOT NULL DEFAULT 0;     -- 0: none
ALTER TABLE tenants ADD COLUMN gpu_hours_per_month REAL NOT NULL DEFAULT 0;     -- 0: none
