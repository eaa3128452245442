-- Every statement that changes slice requests notifies `tessera_changes` (delivered when the transaction commits;
-- several in one transaction are delivered once), so that every server replica can drop what it cached from
-- them. See server/src/store/changes.rs.
CREATE FUNCTION tessera_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('tessera_changes', TG_TABLE_NAME);
    RETURN NULL;
END
$$;

CREATE TRIGGER slice_requests_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON slice_requests
    FOR EACH STATEMENT EXECUTE FUNCTION tessera_notify_change();
