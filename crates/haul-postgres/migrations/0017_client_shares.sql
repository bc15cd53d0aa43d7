-- Fair shares of a saturated channel (docs/design.md, "Send rates"): each load's
-- client, written by the append with the load_update that sets it, so a dispatcher
-- holding rows back can queue each client's behind its own. A load written before
-- this has none until its next load_update names one (its rows share the queue of
-- loads with no client meanwhile); the log is not read back to fill it.
ALTER TABLE load_facts ADD COLUMN client text;

-- How many sends the last take granted: what lets one statement take sends and say
-- how many (an upsert answers only the row as it left it).
ALTER TABLE send_rates ADD COLUMN last_granted bigint;
