-- Record mode (docs/api.md): a channel with no URL records its deliveries here, deduped by key.
CREATE TABLE deliveries (
    id         bigserial PRIMARY KEY,
    channel    text NOT NULL,
    key        text NOT NULL,
    load_id    text NOT NULL,
    payload    text NOT NULL,
    created_at bigint NOT NULL,
    CONSTRAINT deliveries_key UNIQUE (channel, key)
);
CREATE INDEX deliveries_load ON deliveries (load_id, id);
