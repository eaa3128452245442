-- A counter of changes to the fleet (nodes and their GPUs), moved by triggers in the transaction that makes each
-- change, so that a server reads the fleet (10,000 nodes, 80,000 GPUs: a second and more on a busy server) again
-- only when it changed: reading the counter first, it keeps what it read under that value.

CREATE TABLE fleet_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO fleet_version (id, version) VALUES (1, 1);

CREATE TRIGGER gpus_inserted_fleet_version AFTER INSERT ON gpus
BEGIN
    UPDATE fleet_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER gpus_updated_fleet_version AFTER UPDATE ON gpus
BEGIN
    UPDATE fleet_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER gpus_deleted_fleet_version AFTER DELETE ON gpus
BEGIN
    UPDATE fleet_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER nodes_inserted_fleet_version AFTER INSERT ON nodes
BEGIN
    UPDATE fleet_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER nodes_renamed_fleet_version AFTER UPDATE OF id, name, created_at_ms ON nodes
BEGIN
    UPDATE fleet_version SET version = version + 1 WHERE id = 1;
END;
CREATE TRIGGER nodes_deleted_fleet_version AFTER DELETE ON nodes
BEGIN
    UPDATE fleet_version SET version = version + 1 WHERE id = 1;
END;
