-- A channel's sends in flight (channels.*.in_flight), across every dispatcher: one
-- row per send that holds a slot, until its claim's lease ends (a dispatcher that dies
-- mid-send frees its slots when its leases lapse). Freed by the send's own claim.
CREATE TABLE send_slots (
    rate_key  TEXT NOT NULL,
    outbox_id TEXT NOT NULL,
    token     TEXT NOT NULL,
    until_us  bigint NOT NULL,
    PRIMARY KEY (rate_key, outbox_id)
);
