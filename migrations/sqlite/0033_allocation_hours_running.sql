-- Each kept hour also holds its allocation's running sums up to and including it, so that a report sums any
-- run of an allocation's kept hours from two rows (the last's running sums less the first's before it) instead of
-- reading every hour in between. Worked out here for the hours kept so far.
ALTER TABLE allocation_hours ADD COLUMN running_weighted REAL NOT NULL DEFAULT 0;
ALTER TABLE allocation_hours ADD COLUMN running_samples INTEGER NOT NULL DEFAULT 0;
UPDATE allocation_hours SET
    running_weighted = (SELECT SUM(p.weighted) FROM allocation_hours p
        WHERE p.allocation_id = allocation_hours.allocation_id AND p.hour_ms <= allocation_hours.hour_ms),
    running_samples = (SELECT SUM(p.samples) FROM allocation_hours p
        WHERE p.allocation_id = allocation_hours.allocation_id AND p.hour_ms <= allocation_hours.hour_ms);
