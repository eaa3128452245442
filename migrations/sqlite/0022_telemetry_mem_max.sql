-- The highest memory in use within each minute (right-sizing judges on the peak). Rows written before it have
-- none, and readers fall back to the minute's mean.
ALTER TABLE telemetry_minutes ADD COLUMN mem_used_max REAL;
