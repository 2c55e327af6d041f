-- GPU fleet: each node's normalized gpu_type (api/gpu_types.h) and the GPU
-- inventory its agent reported at registration (models, memory, SMs, compute
-- capability, driver and CUDA versions, NVLink/PCIe topology; JSON as in
-- agent/gpu.h), prices per gpu_type (PUT /v1/prices), and the type and
-- currency each usage row was billed at.

ALTER TABLE nodes ADD COLUMN gpu_type TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN inventory TEXT NOT NULL DEFAULT '{}';

CREATE TABLE gpu_prices (
    gpu_type      TEXT PRIMARY KEY,          -- api/gpu_types.h name, or "cpu"
    per_gpu_hour  REAL NOT NULL,             -- price of one device for one hour
    per_gpu_month REAL,                      -- optional monthly (reserved) price; NULL: none
    currency      TEXT NOT NULL,             -- ISO 4217 code, e.g. "USD"
    updated_at    INTEGER NOT NULL,
    updated_by    TEXT NOT NULL DEFAULT ''
) WITHOUT ROWID;

ALTER TABLE usage ADD COLUMN gpu_type TEXT NOT NULL DEFAULT '';
ALTER TABLE usage ADD COLUMN currency TEXT NOT NULL DEFAULT '';

-- The scheduler reads resources.gpu_type / allow_mixed of queued jobs through
-- this partial index: it holds only the jobs that name a type or allow mixing.
CREATE INDEX jobs_gpu_placement
    ON jobs(state, json_extract(spec, '$.resources.gpu_type'),
            json_extract(spec, '$.resources.allow_mixed'))
    WHERE json_extract(spec, '$.resources.gpu_type') IS NOT NULL
       OR json_extract(spec, '$.resources.allow_mixed') = 1;
