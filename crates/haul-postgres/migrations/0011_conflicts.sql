-- Appends the version check refused, per load, for the operators' query of the loads
-- with the most conflicts. The worker counts each refusal after its transaction rolled
-- back; the log is untouched. Adding columns with a constant default rewrites nothing.
ALTER TABLE loads
    ADD COLUMN conflicts bigint NOT NULL DEFAULT 0,
    ADD COLUMN last_conflict_at bigint;
-- The few loads with any, most first.
CREATE INDEX loads_conflicts ON loads (conflicts DESC, load_id) WHERE conflicts > 0;
