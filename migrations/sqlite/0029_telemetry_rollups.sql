-- Telemetry kept at three resolutions (tessera_core::rollup::Tier): the minutes for 48 hours, and rollups of them
-- per 10 minutes (35 days) and per hour (400 days), written with each minute (sample-weighted means, maxima) and
-- pruned by time. `minute_ms` is the start of a row's bucket in every series; `minutes` how many minutes of it had
-- telemetry. The rollups are filled from the minutes already stored.

ALTER TABLE telemetry_minutes ADD COLUMN minutes INTEGER NOT NULL DEFAULT 1;

CREATE TABLE telemetry_tenminutes (
    device TEXT NOT NULL,
    minute_ms INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    gpu TEXT NOT NULL,
    profile TEXT,
    start INTEGER,
    samples INTEGER NOT NULL,
    util_avg REAL NOT NULL,
    util_max REAL NOT NULL,
    mem_used_avg REAL NOT NULL,
    mem_total REAL NOT NULL,
    power_avg REAL,
    temp_max REAL,
    mem_used_max REAL,
    minutes INTEGER NOT NULL,
    PRIMARY KEY (device, minute_ms)
);
CREATE INDEX telemetry_tenminutes_node ON telemetry_tenminutes (node_id, minute_ms);
CREATE INDEX telemetry_tenminutes_minute ON telemetry_tenminutes (minute_ms);

CREATE TABLE telemetry_hours (
    device TEXT NOT NULL,
    minute_ms INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    gpu TEXT NOT NULL,
    profile TEXT,
    start INTEGER,
    samples INTEGER NOT NULL,
    util_avg REAL NOT NULL,
    util_max REAL NOT NULL,
    mem_used_avg REAL NOT NULL,
    mem_total REAL NOT NULL,
    power_avg REAL,
    temp_max REAL,
    mem_used_max REAL,
    minutes INTEGER NOT NULL,
    PRIMARY KEY (device, minute_ms)
);
CREATE INDEX telemetry_hours_node ON telemetry_hours (node_id, minute_ms);
CREATE INDEX telemetry_hours_minute ON telemetry_hours (minute_ms);

INSERT INTO telemetry_tenminutes
SELECT device, minute_ms - (minute_ms % 600000), MAX(node_id), MAX(gpu), MAX(profile), MAX(start), SUM(samples),
    SUM(util_avg * samples) / SUM(samples), MAX(util_max), SUM(mem_used_avg * samples) / SUM(samples),
    MAX(mem_total), SUM(power_avg * samples) / SUM(CASE WHEN power_avg IS NULL THEN 0 ELSE samples END),
    MAX(temp_max), MAX(COALESCE(mem_used_max, mem_used_avg)), COUNT(*)
FROM telemetry_minutes WHERE samples > 0 GROUP BY device, minute_ms - (minute_ms % 600000);

INSERT INTO telemetry_hours
SELECT device, minute_ms - (minute_ms % 3600000), MAX(node_id), MAX(gpu), MAX(profile), MAX(start), SUM(samples),
    SUM(util_avg * samples) / SUM(samples), MAX(util_max), SUM(mem_used_avg * samples) / SUM(samples),
    MAX(mem_total), SUM(power_avg * samples) / SUM(CASE WHEN power_avg IS NULL THEN 0 ELSE samples END),
    MAX(temp_max), MAX(COALESCE(mem_used_max, mem_used_avg)), COUNT(*)
FROM telemetry_minutes WHERE samples > 0 GROUP BY device, minute_ms - (minute_ms % 3600000);

-- Who holds a device now (right-sizing counts the holders of the devices it judges, not of the fleet).
CREATE INDEX allocations_active_by_device ON allocations (device_uuid) WHERE state = 'active';
