-- Operator actions (docs/design.md, "Operator actions").
--
-- A bulk requeue picks dead rows of one action type since a time ("every dead
-- create_hero_task since 07:00"), oldest death first: an index of the dead rows by type
-- and death time, so it reads only what it returns.
CREATE INDEX outbox_dead_type ON outbox (action_type, dead_at, id) WHERE status = 'dead';

-- An unmatched SMS an operator handed to a load: which load, by which operator event
-- (op:{request id}), when. Set once; the row stays in the unmatched list, marked.
ALTER TABLE unmatched_sms ADD COLUMN assigned_load TEXT;
ALTER TABLE unmatched_sms ADD COLUMN assigned_event TEXT;
ALTER TABLE unmatched_sms ADD COLUMN assigned_at INTEGER;
