-- When the row's terminal outcome (delivered or failed) reached the load queue. A dead
-- row whose failed outcome could not be published (a queue outage) is found by the
-- dispatcher's sweep and published later; OpsAlerts follow that publish.
ALTER TABLE outbox ADD COLUMN outcome_published_at bigint;
CREATE INDEX outbox_dead_unpublished ON outbox (dead_at) WHERE status = 'dead' AND outcome_published_at IS NULL;
