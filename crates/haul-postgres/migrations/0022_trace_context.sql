-- The W3C trace context (`traceparent` text) each hop of an event keeps, so the
-- event's trace goes on across crashes, redeliveries and restarts: the queued message
-- (its producer's), the log entry and the outbox rows and timers (the run that wrote
-- them). NULL where none was given (evals, replays, rows from before this column).
-- IF NOT EXISTS: the upgrade tests give an old schema these columns before they
-- write to it through this build.
ALTER TABLE queue ADD COLUMN IF NOT EXISTS trace TEXT;
ALTER TABLE events ADD COLUMN IF NOT EXISTS trace TEXT;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS trace TEXT;
ALTER TABLE timers ADD COLUMN IF NOT EXISTS trace TEXT;
