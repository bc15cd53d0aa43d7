-- What the agent's model calls cost, per client and UTC day: each LLM decision's
-- append adds its tokens and cost here in its transaction (Derived::spend), so the
-- client's day budget is read from one row. `client` is '' for loads without one;
-- `capped_at` is when a decision first found the day's budget spent (the one that
-- raised the OpsAlert).
CREATE TABLE llm_spend (
    client         TEXT NOT NULL,
    day            TEXT NOT NULL,
    input_tokens   INTEGER NOT NULL,
    output_tokens  INTEGER NOT NULL,
    cost_micro_usd INTEGER NOT NULL,
    calls          INTEGER NOT NULL,
    capped_at      INTEGER,
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (client, day)
) WITHOUT ROWID;
-- `haul query spend`: a day's clients.
CREATE INDEX llm_spend_day ON llm_spend (day, client);
-- The prompts LLM decisions were given, once each by the SHA-256 (hex) of their text:
-- a decision's `llm.prompt_hash` (the system message and tools) and `llm.input_hash`
-- (its user message) name rows here, so the log does not grow with every prompt.
CREATE TABLE prompts (
    hash       TEXT PRIMARY KEY,
    text       TEXT NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;
