-- Every Twilio MessageSid the webhook took, across all loads, and where it sent the
-- message: the load it was published to, or NULL when it was kept as unmatched. A
-- replayed request (Twilio's signatures do not expire) finds its sid here and goes
-- nowhere new; Twilio's retry of a request whose publish failed goes to the same load.
-- Kept for good, as the log is: a forgotten sid would let its replay through. Insert-only.
CREATE TABLE message_sids (
    message_sid text PRIMARY KEY,
    load_id     text,
    claimed_at  bigint NOT NULL
);

-- The sids taken before this table: the SMS in logs and on the queue, where they went,
-- then the unmatched ones. The log is read once, whole (no index has its entry ids
-- by prefix); it takes no lock that stops appends.
INSERT INTO message_sids (message_sid, load_id, claimed_at)
    SELECT substr(entry_id, 5), load_id, recorded_at FROM events WHERE entry_id LIKE 'sms:%'
    ON CONFLICT (message_sid) DO NOTHING;
INSERT INTO message_sids (message_sid, load_id, claimed_at)
    SELECT substr(event_id, 5), load_id, enqueued_at FROM queue WHERE event_id LIKE 'sms:%'
    ON CONFLICT (message_sid) DO NOTHING;
INSERT INTO message_sids (message_sid, load_id, claimed_at)
    SELECT message_sid, NULL, received_at FROM unmatched_sms
    ON CONFLICT (message_sid) DO NOTHING;

-- Why an SMS was kept as unmatched: no single active load has its number (all of them
-- before this migration), or it did not validate.
ALTER TABLE unmatched_sms ADD COLUMN reason text NOT NULL DEFAULT 'no single active load has this driver phone';
-- The list, newest first, without sorting the table.
CREATE INDEX unmatched_sms_received ON unmatched_sms (received_at, message_sid);
