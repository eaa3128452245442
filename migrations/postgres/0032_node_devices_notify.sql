-- The devices a node may send telemetry for are its registered GPUs and the MIG instances its stored status
-- reports on them. Every replica caches them per node (the telemetry of 10,000 nodes would otherwise read them back
-- every few seconds), so a change notifies `tessera_node_devices` with the node's id and each replica forgets its
-- copy: a GPU registered to, moved from or removed from a node, or a status whose MIG instances differ from the
-- stored one's (a status that only repeats them, every 30 s per node, notifies nothing).

CREATE FUNCTION tessera_notify_gpu_devices() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM pg_notify('tessera_node_devices', OLD.node_id);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM pg_notify('tessera_node_devices', NEW.node_id);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER gpus_node_devices AFTER INSERT OR DELETE OR UPDATE OF uuid, node_id ON gpus
    FOR EACH ROW EXECUTE FUNCTION tessera_notify_gpu_devices();

CREATE FUNCTION tessera_notify_status_devices() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IS NULL OR NEW.status IS NULL
        OR jsonb_path_query_array(OLD.status::jsonb, '$.gpus[*].instances[*].uuid')
            IS DISTINCT FROM jsonb_path_query_array(NEW.status::jsonb, '$.gpus[*].instances[*].uuid') THEN
        PERFORM pg_notify('tessera_node_devices', NEW.id);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER nodes_status_devices AFTER UPDATE OF status ON nodes
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION tessera_notify_status_devices();
