-- Scoped and expiring tenant API tokens. scopes is a bit set (daemon/auth.h):
-- 1 read (GET routes, plan), 2 submit (submit, cancel and other writes),
-- 4 admin (admin routes; only tokens of the tenant named "admin"). Tokens
-- issued before this migration keep read+submit (what they could do) and
-- never expire. Times are integer milliseconds since the Unix epoch; NULL
-- expires_at: no expiry; last_used_at is recorded at most once a minute.

ALTER TABLE tokens ADD COLUMN name TEXT NOT NULL DEFAULT '';
ALTER TABLE tokens ADD COLUMN scopes INTEGER NOT NULL DEFAULT 3;
ALTER TABLE tokens ADD COLUMN expires_at INTEGER;
ALTER TABLE tokens ADD COLUMN last_used_at INTEGER;
