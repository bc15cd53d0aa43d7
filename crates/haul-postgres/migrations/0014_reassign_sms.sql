-- An operator may move an assigned SMS to the load it really belongs to
-- (docs/console.md, "Unmatched SMS"). Each move is kept by its operator event: a
-- retried request finds its own move and the load it took the SMS from (to tell that
-- load again), and never moves the SMS a second time after another request did.
CREATE TABLE sms_moves (
    message_sid TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    from_load   TEXT NOT NULL,
    to_load     TEXT NOT NULL,
    moved_at    bigint NOT NULL,
    PRIMARY KEY (message_sid, event_id)
);
