-- A cpu node's measured fp32 peak of one device in GFLOP/s (loom-agent's
-- start-up GEMM calibration, agent/cpupeak.h), as reported at registration,
-- so GET /v1/nodes shows it after a loomd restart. 0 when none was reported.
ALTER TABLE nodes ADD COLUMN cpu_peak_gflops REAL NOT NULL DEFAULT 0;
