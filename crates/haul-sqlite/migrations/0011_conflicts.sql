-- Appends the version check refused, per load, for the operators' query of the loads
-- with the most conflicts. The worker counts each refusal after its transaction rolled
-- back; the log is untouched.
ALTER TABLE loads ADD COLUMN conflicts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE loads ADD COLUMN last_conflict_at INTEGER;
-- The few loads with any, most first.
CREATE INDEX loads_conflicts ON loads (conflicts DESC, load_id) WHERE conflicts > 0;
