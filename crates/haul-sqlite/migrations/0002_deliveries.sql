-- Record mode (docs/api.md): a channel with no URL records its deliveries here, deduped by key.
CREATE TABLE deliveries (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    channel    TEXT NOT NULL,
    key        TEXT NOT NULL,
    load_id    TEXT NOT NULL,
    payload    TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (channel, key)
);
CREATE INDEX deliveries_load ON deliveries (load_id, id);
