-- The channels' send rates (docs/design.md, "Send rates"): per channel or sending
-- number, the theoretical arrival time of its next send (microseconds since the
-- epoch), the whole state of its limiter, shared by every dispatcher; and when rows
-- were last held back by it (a saturated channel, on the console's overview).
CREATE TABLE send_rates (
    rate_key   TEXT PRIMARY KEY,
    tat_us     INTEGER NOT NULL,
    held_at_us INTEGER
) WITHOUT ROWID;
