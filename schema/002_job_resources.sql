-- Resource columns the scheduler needs on every pass, copied from the spec at
-- submit so a pass does not parse every queued job's spec JSON.
ALTER TABLE jobs ADD COLUMN tp INTEGER NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN device TEXT NOT NULL DEFAULT 'cuda';
ALTER TABLE jobs ADD COLUMN gpus_per_node INTEGER NOT NULL DEFAULT 0;
-- Jobs stored before this migration: take the values from their spec.
UPDATE jobs SET tp = COALESCE(json_extract(spec, '$.parallel.tp'), 1),
                device = COALESCE(json_extract(spec, '$.resources.device'), 'cuda'),
                gpus_per_node = COALESCE(json_extract(spec, '$.resources.gpus_per_node'), 0);
