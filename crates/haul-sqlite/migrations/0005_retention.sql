-- Retention (haul prune): each prune batch finds its rows through an index on the time
-- the row finished, restricted to finished rows, so a batch never reads live rows.
CREATE INDEX outbox_prunable ON outbox (updated_at) WHERE status <> 'pending' AND outcome_published_at IS NOT NULL;
CREATE INDEX timers_finished ON timers (COALESCE(fired_at, canceled_at)) WHERE status <> 'scheduled';
CREATE INDEX queue_acked ON queue (acked_at) WHERE acked_at IS NOT NULL;
