-- The operators' inbox (docs/console.md, "The inbox"). A dead row is open until a
-- decision takes it out: handled (a copy an operator requeued was delivered) or
-- dismissed (an operator said why nothing more is to be done). The append that
-- records the decision writes its state, its event and when, in its transaction.
ALTER TABLE outbox ADD COLUMN inbox_state TEXT;
ALTER TABLE outbox ADD COLUMN inbox_event TEXT;
ALTER TABLE outbox ADD COLUMN inbox_at INTEGER;
-- The open dead rows, newest first, in pages, and counted by type for the overview.
CREATE INDEX outbox_dead_open ON outbox (dead_at, id) WHERE status = 'dead' AND inbox_state IS NULL;

-- Dead rows requeued before this migration whose copy was delivered: handled, as the
-- decision on the copy's delivery now says (a chain's older rows are left open).
UPDATE outbox SET inbox_state = 'handled', inbox_event = 'migration 13',
    inbox_at = (SELECT max(c.updated_at) FROM outbox c
                WHERE c.load_id = outbox.load_id AND c.status = 'dispatched'
                  AND json_extract(c.action, '$.requeue_of') = outbox.id)
WHERE status = 'dead' AND EXISTS (SELECT 1 FROM outbox c
    WHERE c.load_id = outbox.load_id AND c.status = 'dispatched' AND json_extract(c.action, '$.requeue_of') = outbox.id);

-- An unmatched SMS belongs to no load, so its dismissal is kept here: who, why, when.
ALTER TABLE unmatched_sms ADD COLUMN dismissed_by TEXT;
ALTER TABLE unmatched_sms ADD COLUMN dismissed_reason TEXT;
ALTER TABLE unmatched_sms ADD COLUMN dismissed_at INTEGER;
-- The open ones, counted for the navigation.
CREATE INDEX unmatched_sms_open ON unmatched_sms (received_at) WHERE assigned_load IS NULL AND dismissed_at IS NULL;
