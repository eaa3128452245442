-- A counter of changes to the fleet (nodes and their GPUs), moved in the transaction that makes each change, so
-- that a replica reads the fleet (10,000 nodes, 80,000 GPUs) again only when it changed: reading the counter
-- first, it keeps what it read under that value. The triggers are deferred to the commit, so that the counter's
-- row is the last lock a transaction takes (transactions writing GPUs in different orders cannot deadlock on it).

CREATE TABLE fleet_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO fleet_version (id, version) VALUES (1, 1);

CREATE FUNCTION tessera_fleet_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE fleet_version SET version = version + 1 WHERE id = 1;
    RETURN NULL;
END;
$$;

CREATE CONSTRAINT TRIGGER gpus_fleet_version AFTER INSERT OR UPDATE OR DELETE ON gpus
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tessera_fleet_version();
CREATE CONSTRAINT TRIGGER nodes_fleet_version AFTER INSERT OR DELETE OR UPDATE OF id, name, created_at_ms ON nodes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tessera_fleet_version();
