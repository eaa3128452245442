-- The queue a request waits in (`tessera_core::request::QueueClass`): `mig:<profile>` or `gpu`, and the catalog key
-- of its model (NULL: any model). Written when a request is made; the store fills it for live requests made
-- before this migration, as it opens. A pending request's place in the queue is then one count over the index:
-- the pending requests of its kind, made before it, on its model or any.
ALTER TABLE slice_requests ADD COLUMN queue_kind TEXT;
ALTER TABLE slice_requests ADD COLUMN queue_model TEXT;
CREATE INDEX slice_requests_queue ON slice_requests (state, queue_kind, created_at_ms, id);
