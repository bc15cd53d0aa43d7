-- Fair shares of a saturated channel (docs/design.md, "Send rates"): each load's
-- client, written by the append with the load_update that sets it, so a dispatcher
-- holding rows back can queue each client's behind its own. A load written before
-- this has none until its next load_update names one (its rows share the queue of
-- loads with no client meanwhile); the log is not read back to fill it.
ALTER TABLE load_facts ADD COLUMN client text;
