-- Each kept hour also holds its allocation's running sums up to and including it, so that a report sums any
-- run of an allocation's kept hours from two rows (the last's running sums less the first's before it) instead of
-- reading every hour in between. Worked out here for the hours kept so far, in one pass.
ALTER TABLE allocation_hours ADD COLUMN running_weighted REAL NOT NULL DEFAULT 0;
ALTER TABLE allocation_hours ADD COLUMN running_samples INTEGER NOT NULL DEFAULT 0;
UPDATE allocation_hours SET running_weighted = r.rw, running_samples = r.rs
FROM (
    SELECT allocation_id AS a, hour_ms AS h, SUM(weighted) OVER w AS rw, SUM(samples) OVER w AS rs
    FROM allocation_hours WINDOW w AS (PARTITION BY allocation_id ORDER BY hour_ms)
) r
WHERE allocation_hours.allocation_id = r.a AND allocation_hours.hour_ms = r.h;
