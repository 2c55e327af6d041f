-- Webhooks (daemon/webhooks.h): subscriptions and the delivery outbox. An
-- outbox row per (webhook, event) is inserted in the same transaction as the
-- event, so a delivery is never lost across a crash of loomd; the delivery
-- thread walks the due rows and records every attempt.
CREATE TABLE webhooks (
    id          TEXT PRIMARY KEY,            -- "wh-" + 12 hex
    tenant_id   TEXT NOT NULL,
    url         TEXT NOT NULL,
    events      TEXT NOT NULL,               -- JSON array of event types, or ["*"]
    secret      TEXT NOT NULL,               -- HMAC key (needed in clear to sign)
    created_at  INTEGER NOT NULL,
    deleted_at  INTEGER
);
CREATE INDEX webhooks_tenant ON webhooks(tenant_id, created_at);

CREATE TABLE webhook_deliveries (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    webhook_id   TEXT NOT NULL,
    event_seq    INTEGER NOT NULL,
    state        TEXT NOT NULL,              -- pending | delivered | failed | cancelled
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_at      INTEGER NOT NULL,           -- when the next attempt is due
    last_status  INTEGER,                    -- HTTP status of the last attempt (0: no answer)
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    delivered_at INTEGER,
    UNIQUE (webhook_id, event_seq)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries(state, next_at);
CREATE INDEX webhook_deliveries_hook ON webhook_deliveries(webhook_id, id);
