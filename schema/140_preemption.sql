-- Preemption: attempts a job lost to a higher-priority job. They are requeued
-- like retries (attempt + 1) but use none of max_retries.

ALTER TABLE jobs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0;
