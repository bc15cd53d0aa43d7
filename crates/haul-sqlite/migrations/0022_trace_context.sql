-- The W3C trace context (`traceparent` text) each hop of an event keeps, so the
-- event's trace goes on across crashes, redeliveries and restarts: the queued message
-- (its producer's), the log entry and the outbox rows and timers (the run that wrote
-- them). NULL where none was given (evals, replays, rows from before this column).
ALTER TABLE queue ADD COLUMN trace TEXT;
ALTER TABLE events ADD COLUMN trace TEXT;
ALTER TABLE outbox ADD COLUMN trace TEXT;
ALTER TABLE timers ADD COLUMN trace TEXT;
