-- The delivery thread reads each webhook's due rows on their own (so one
-- webhook's backlog cannot crowd out the others): a partial index over the
-- pending rows only, small however long the delivered history grows.
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries(webhook_id, next_at, id)
    WHERE state = 'pending';
