-- Request durations (an active request expires duration_s after it becomes active) and layout decision times.

ALTER TABLE slice_requests ADD COLUMN duration_s INTEGER CHECK (duration_s IS NULL OR duration_s > 0);
ALTER TABLE slice_requests ADD COLUMN expires_at_ms INTEGER;
ALTER TABLE layout_proposals ADD COLUMN decided_at_ms INTEGER;
