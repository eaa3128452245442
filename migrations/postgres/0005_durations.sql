-- Request durations (an active request expires duration_s after it becomes active) and layout decision times.

ALTER TABLE slice_requests ADD COLUMN duration_s BIGINT CHECK (duration_s IS NULL OR duration_s > 0);
ALTER TABLE slice_requests ADD COLUMN expires_at TIMESTAMPTZ;
ALTER TABLE layout_proposals ADD COLUMN decided_at TIMESTAMPTZ;
