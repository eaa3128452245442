-- The live requests by state (the queue, and the requests holding slices) are read without scanning the history;
-- the few bounded in time (made for a reservation, or with an end) without scanning the queue.
CREATE INDEX slice_requests_by_state ON slice_requests (state, id);
CREATE INDEX slice_requests_windowed ON slice_requests (state) WHERE starts_at_ms IS NOT NULL OR ends_by_ms IS NOT NULL;
