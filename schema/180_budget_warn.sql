-- Running jobs and the monthly GPU-hour budget: when a tenant's
-- gpu_hours_per_month is used up its running jobs checkpoint and stop with
-- BUDGET_EXHAUSTED, unless the admin made the tenant warn-only (one event per
-- attempt, the job goes on). loomd --budget-warn-only does that for all.

ALTER TABLE tenants ADD COLUMN budget_warn_only INTEGER NOT NULL DEFAULT 0;     -- 1: warn, not stop
