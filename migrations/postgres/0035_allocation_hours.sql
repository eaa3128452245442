-- What each allocation's device did in each hour it was held, kept once the hour has ended: per allocation and
-- hour, the sums a sample-weighted mean needs (utilisation x samples, samples) over the allocation's part of that
-- hour. Usage and efficiency reports sum these instead of reading every allocation's stored series again.
CREATE TABLE allocation_hours (
    allocation_id TEXT NOT NULL REFERENCES allocations (id) ON DELETE CASCADE,
    hour_ms BIGINT NOT NULL,
    weighted DOUBLE PRECISION NOT NULL,
    samples BIGINT NOT NULL,
    PRIMARY KEY (allocation_id, hour_ms)
);
CREATE INDEX allocation_hours_by_hour ON allocation_hours (hour_ms);

-- The hours kept: every hour starting in [from_ms, to_ms) is in allocation_hours (an hour without telemetry has no
-- rows). One row; `to_ms` moves an hour at a time, by compare-and-set on it and `epoch`, so replicas keep each
-- hour once; a write of telemetry or use into hours already kept moves `to_ms` back and `epoch` on, so an hour
-- worked out before such a write is not kept.
CREATE TABLE allocation_hours_kept (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    from_ms BIGINT NOT NULL,
    to_ms BIGINT NOT NULL,
    epoch BIGINT NOT NULL DEFAULT 0
);
