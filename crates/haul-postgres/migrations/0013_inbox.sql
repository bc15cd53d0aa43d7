-- The operators' inbox (docs/console.md, "The inbox"). A dead row is open until a
-- decision takes it out: handled (a copy an operator requeued was delivered) or
-- dismissed (an operator said why nothing more is to be done). The append that
-- records the decision writes its state, its event and when, in its transaction.
ALTER TABLE outbox ADD COLUMN inbox_state text;
ALTER TABLE outbox ADD COLUMN inbox_event text;
ALTER TABLE outbox ADD COLUMN inbox_at bigint;
-- The open dead rows, newest first, in pages, and counted by type for the overview.
CREATE INDEX outbox_dead_open ON outbox (dead_at, id) WHERE status = 'dead' AND inbox_state IS NULL;

-- Dead rows requeued before this migration whose copy was delivered: handled, as the
-- decision on the copy's delivery now says (a chain's older rows are left open).
UPDATE outbox d SET inbox_state = 'handled', inbox_event = 'migration 13', inbox_at = c.updated_at
FROM outbox c
WHERE d.status = 'dead' AND c.load_id = d.load_id AND c.status = 'dispatched'
  AND (c.action::jsonb ->> 'requeue_of') = d.id;

-- An unmatched SMS belongs to no load, so its dismissal is kept here: who, why, when.
ALTER TABLE unmatched_sms ADD COLUMN dismissed_by text;
ALTER TABLE unmatched_sms ADD COLUMN dismissed_reason text;
ALTER TABLE unmatched_sms ADD COLUMN dismissed_at bigint;
-- The open ones, counted for the navigation.
CREATE INDEX unmatched_sms_open ON unmatched_sms (received_at) WHERE assigned_load IS NULL AND dismissed_at IS NULL;
