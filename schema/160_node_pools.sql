-- Node pools and labels, set by an admin (PATCH /v1/nodes/{id}); jobs select
-- nodes with resources.pool and resources.labels (docs/scheduling.md).
-- pool: "" for none; labels: a JSON object of string values.
ALTER TABLE nodes ADD COLUMN pool TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';

-- The scheduler reads the selectors of queued jobs through this partial
-- index: it holds only the jobs that name a pool or labels.
CREATE INDEX jobs_node_selector
    ON jobs(state, json_extract(spec, '$.resources.pool'),
            json_extract(spec, '$.resources.labels'))
    WHERE json_extract(spec, '$.resources.pool') IS NOT NULL
       OR json_extract(spec, '$.resources.labels') IS NOT NULL;
