-- The consent ledger: per phone, the STOP or START that last changed its consent to
-- SMS, whichever load it reached (load_id NULL: none, it was kept unmatched). An
-- append writes what its inbound SMS change (Derived::consent) in its transaction; the
-- webhook writes a keyword that reached no load. Only phones that ever opted out have
-- a row. The dispatcher sends no SMS to a phone opted out here, so a load the STOP
-- never reached (the driver's next load) learns it from its first refused ask.
-- Consent recorded before this table lives in its loads' logs only.
CREATE TABLE sms_consent (
    phone      TEXT PRIMARY KEY,
    opted_out  integer NOT NULL,
    event_id   TEXT NOT NULL,
    load_id    TEXT,
    changed_at bigint NOT NULL
);
-- `haul query opted-out`: the latest opt-out first.
CREATE INDEX sms_consent_opted_out ON sms_consent (changed_at, phone) WHERE opted_out = 1;
