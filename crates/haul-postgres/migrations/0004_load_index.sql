-- Derived facts the API looks loads up by (the Twilio webhook matches an SMS to the
-- active load whose driver phone sent it). The log stays the source of truth: the
-- worker rewrites a load's row after each load_update it commits.
CREATE TABLE load_facts (
    load_id      text PRIMARY KEY,
    driver_phone text,
    active       boolean NOT NULL,
    updated_at   bigint NOT NULL
);
CREATE INDEX load_facts_phone ON load_facts (driver_phone) WHERE active;

-- Inbound SMS that matched no active load (docs/api.md: kept, counted, listed).
CREATE TABLE unmatched_sms (
    message_sid text PRIMARY KEY,
    from_phone  text NOT NULL,
    to_phone    text NOT NULL,
    body        text NOT NULL,
    received_at bigint NOT NULL
);
