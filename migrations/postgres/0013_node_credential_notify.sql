-- Revoking a node's credentials (by hand, or by the node joining again) notifies `tessera_node_credentials` with
-- the node's id, so that every replica closes that node's open WebSockets at once and forgets the credential.

CREATE FUNCTION tessera_notify_node_credentials() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.revoked_at_ms IS NULL AND NEW.revoked_at_ms IS NOT NULL THEN
        PERFORM pg_notify('tessera_node_credentials', NEW.node_id);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER node_credentials_revoked AFTER UPDATE ON node_credentials
    FOR EACH ROW EXECUTE FUNCTION tessera_notify_node_credentials();
