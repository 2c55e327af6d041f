-- train.precision fp8 runs only on GPUs with FP8 tensor cores (compute
-- capability 8.9 or newer, api/gpu_types.h GPU_FP8_MIN_CC). The scheduler
-- reads which queued jobs ask for it through this partial index: it holds
-- only fp8 jobs, so other queues cost no JSON parsing.
CREATE INDEX jobs_fp8 ON jobs(state)
    WHERE json_extract(spec, '$.train.precision') = 'fp8';
