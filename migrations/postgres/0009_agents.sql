-- Node agents: join tokens (single use, only a SHA-256 of the secret is stored), each node's spec generation and
-- the status its agent last reported, and when allocations became active or were released (usage metering).
-- A change of a node's spec generation notifies `tessera_node_spec` with `<node id>:<generation>`, so the replica
-- an agent is connected to pushes the new spec at once, whichever replica made the change.

CREATE TABLE join_tokens (
    id TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL UNIQUE,
    node_name TEXT,
    created_by TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    used_at_ms BIGINT,
    node_id TEXT REFERENCES nodes (id) ON DELETE SET NULL
);

ALTER TABLE nodes ADD COLUMN generation BIGINT NOT NULL DEFAULT 1;
ALTER TABLE nodes ADD COLUMN spec_hash TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN observed_generation BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN status TEXT;
ALTER TABLE nodes ADD COLUMN status_at_ms BIGINT;
ALTER TABLE nodes ADD COLUMN last_seen_ms BIGINT;
ALTER TABLE nodes ADD COLUMN inventory TEXT;

ALTER TABLE allocations ADD COLUMN device_uuid TEXT;
ALTER TABLE allocations ADD COLUMN activated_at_ms BIGINT;
ALTER TABLE allocations ADD COLUMN released_at_ms BIGINT;

CREATE FUNCTION tessera_notify_node_spec() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.generation IS DISTINCT FROM OLD.generation THEN
        PERFORM pg_notify('tessera_node_spec', NEW.id || ':' || NEW.generation);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER nodes_spec_changed
    AFTER UPDATE OF generation ON nodes
    FOR EACH ROW EXECUTE FUNCTION tessera_notify_node_spec();
