-- What changed since a time, found by that time: the quota standing reads the requests that ended (or changed) and
-- the allocations released since the hours it has already worked out, with the live ones, not every request of a
-- resource.
CREATE INDEX slice_requests_by_update ON slice_requests (updated_at_ms);
CREATE INDEX allocations_by_release ON allocations (released_at_ms);
