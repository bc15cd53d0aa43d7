-- Delivery reports that said how a message ended (delivered, undelivered, failed),
-- once per message, status and row: on their outbox row's load (outbox_id, load_id),
-- shown by the load's view; or, when they named no SMS of haul's, kept for a person
-- with the reason (outbox_id '', load_id NULL), apart from the row's own report of the
-- same message. Twilio's other statuses are counted, not kept.
CREATE TABLE sms_reports (
    message_sid TEXT NOT NULL,
    status      TEXT NOT NULL,
    error_code  TEXT,
    outbox_id   TEXT NOT NULL,
    load_id     TEXT,
    reason      TEXT,
    reported_at bigint NOT NULL,
    PRIMARY KEY (message_sid, status, outbox_id)
);
CREATE INDEX sms_reports_load ON sms_reports (load_id, reported_at) WHERE load_id IS NOT NULL;
CREATE INDEX sms_reports_unmatched ON sms_reports (reported_at) WHERE load_id IS NULL;
-- haul prune: the oldest first.
CREATE INDEX sms_reports_age ON sms_reports (reported_at);
