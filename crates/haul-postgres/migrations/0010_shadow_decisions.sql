-- Shadow mode (docs/replay.md, "Shadow mode"): what a second decider (decider.shadow)
-- decided on the state, event and time of each committed decision, beside the decision
-- the primary recorded. Kept apart from the log: never dispatched, never read by the
-- primary, pruned with the other finished rows (by recorded_at). One row per event and
-- shadow; a second one (a redelivery) is ignored.
CREATE TABLE shadow_decisions (
    load_id          text NOT NULL,
    event_id         text NOT NULL,
    shadow           text NOT NULL,
    event_seq        bigint NOT NULL,
    event            text NOT NULL,
    rule             text NOT NULL,
    primary_decision text NOT NULL,
    shadow_decision  text,
    agreement        text NOT NULL,
    error            text,
    decided_at       bigint NOT NULL,
    recorded_at      bigint NOT NULL,
    PRIMARY KEY (load_id, event_id, shadow)
);
-- One load's pages, in log order.
CREATE INDEX shadow_decisions_page ON shadow_decisions (load_id, event_seq, shadow);
-- Retention.
CREATE INDEX shadow_decisions_recorded ON shadow_decisions (recorded_at);
