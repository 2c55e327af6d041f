-- Billing: what ended each attempt (user, preempted, node_lost, hang, infra)
-- and whether the policy (--bill-causes) bills it. Rows are now cut at every
-- UTC hour boundary, so months and hours get exactly the time spent in them.

ALTER TABLE usage ADD COLUMN cause TEXT NOT NULL DEFAULT 'user';
ALTER TABLE usage ADD COLUMN billed INTEGER NOT NULL DEFAULT 1;
