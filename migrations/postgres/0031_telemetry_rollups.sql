-- Telemetry kept at three resolutions (tessera_core::rollup::Tier): the minutes for 48 hours, and rollups of them
-- per 10 minutes (35 days) and per hour (400 days), written with each minute (sample-weighted means, maxima).
-- `minute_ms` is the start of a row's bucket in every series; `minutes` how many minutes of it had telemetry.
-- Each series is partitioned by range of `minute_ms`: the server makes the partitions ahead of time and drops
-- whole partitions past the retention (tessera_store::Store::keep_telemetry); a row no partition takes lands in
-- the default partition, moved out when its partition is made. The rollups are made from the minutes stored; only
-- the last 48 hours of minutes move into the partitioned table (what is older lives on in the rollups).

ALTER TABLE telemetry_minutes RENAME TO telemetry_minutes_unpartitioned;

CREATE TABLE telemetry_minutes (
    device TEXT NOT NULL,
    minute_ms BIGINT NOT NULL,
    node_id TEXT NOT NULL,
    gpu TEXT NOT NULL,
    profile TEXT,
    start BIGINT,
    samples BIGINT NOT NULL,
    util_avg DOUBLE PRECISION NOT NULL,
    util_max DOUBLE PRECISION NOT NULL,
    mem_used_avg DOUBLE PRECISION NOT NULL,
    mem_total DOUBLE PRECISION NOT NULL,
    power_avg DOUBLE PRECISION,
    temp_max DOUBLE PRECISION,
    mem_used_max DOUBLE PRECISION,
    minutes BIGINT NOT NULL DEFAULT 1
) PARTITION BY RANGE (minute_ms);
CREATE TABLE telemetry_minutes_default PARTITION OF telemetry_minutes DEFAULT;

INSERT INTO telemetry_minutes (device, minute_ms, node_id, gpu, profile, start, samples, util_avg, util_max,
    mem_used_avg, mem_total, power_avg, temp_max, mem_used_max, minutes)
SELECT device, minute_ms, node_id, gpu, profile, start, samples, util_avg, util_max, mem_used_avg, mem_total,
    power_avg, temp_max, mem_used_max, 1
FROM telemetry_minutes_unpartitioned
WHERE minute_ms >= CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT) - 172800000;

CREATE TABLE telemetry_tenminutes (
    device TEXT NOT NULL,
    minute_ms BIGINT NOT NULL,
    node_id TEXT NOT NULL,
    gpu TEXT NOT NULL,
    profile TEXT,
    start BIGINT,
    samples BIGINT NOT NULL,
    util_avg DOUBLE PRECISION NOT NULL,
    util_max DOUBLE PRECISION NOT NULL,
    mem_used_avg DOUBLE PRECISION NOT NULL,
    mem_total DOUBLE PRECISION NOT NULL,
    power_avg DOUBLE PRECISION,
    temp_max DOUBLE PRECISION,
    mem_used_max DOUBLE PRECISION,
    minutes BIGINT NOT NULL DEFAULT 1
) PARTITION BY RANGE (minute_ms);
CREATE TABLE telemetry_tenminutes_default PARTITION OF telemetry_tenminutes DEFAULT;

INSERT INTO telemetry_tenminutes
SELECT device, minute_ms - (minute_ms % 600000), MAX(node_id), MAX(gpu), MAX(profile), MAX(start), SUM(samples),
    SUM(util_avg * samples) / SUM(samples), MAX(util_max), SUM(mem_used_avg * samples) / SUM(samples),
    MAX(mem_total), SUM(power_avg * samples) / NULLIF(SUM(CASE WHEN power_avg IS NULL THEN 0 ELSE samples END), 0),
    MAX(temp_max), MAX(COALESCE(mem_used_max, mem_used_avg)), COUNT(*)
FROM telemetry_minutes_unpartitioned WHERE samples > 0 GROUP BY device, minute_ms - (minute_ms % 600000);

CREATE TABLE telemetry_hours (
    device TEXT NOT NULL,
    minute_ms BIGINT NOT NULL,
    node_id TEXT NOT NULL,
    gpu TEXT NOT NULL,
    profile TEXT,
    start BIGINT,
    samples BIGINT NOT NULL,
    util_avg DOUBLE PRECISION NOT NULL,
    util_max DOUBLE PRECISION NOT NULL,
    mem_used_avg DOUBLE PRECISION NOT NULL,
    mem_total DOUBLE PRECISION NOT NULL,
    power_avg DOUBLE PRECISION,
    temp_max DOUBLE PRECISION,
    mem_used_max DOUBLE PRECISION,
    minutes BIGINT NOT NULL DEFAULT 1
) PARTITION BY RANGE (minute_ms);
CREATE TABLE telemetry_hours_default PARTITION OF telemetry_hours DEFAULT;

INSERT INTO telemetry_hours
SELECT device, minute_ms - (minute_ms % 3600000), MAX(node_id), MAX(gpu), MAX(profile), MAX(start), SUM(samples),
    SUM(util_avg * samples) / SUM(samples), MAX(util_max), SUM(mem_used_avg * samples) / SUM(samples),
    MAX(mem_total), SUM(power_avg * samples) / NULLIF(SUM(CASE WHEN power_avg IS NULL THEN 0 ELSE samples END), 0),
    MAX(temp_max), MAX(COALESCE(mem_used_max, mem_used_avg)), COUNT(*)
FROM telemetry_minutes_unpartitioned WHERE samples > 0 GROUP BY device, minute_ms - (minute_ms % 3600000);

DROP TABLE telemetry_minutes_unpartitioned;

ALTER TABLE telemetry_minutes ADD PRIMARY KEY (device, minute_ms);
CREATE INDEX telemetry_minutes_node ON telemetry_minutes (node_id, minute_ms);
CREATE INDEX telemetry_minutes_minute ON telemetry_minutes (minute_ms);

ALTER TABLE telemetry_tenminutes ADD PRIMARY KEY (device, minute_ms);
CREATE INDEX telemetry_tenminutes_node ON telemetry_tenminutes (node_id, minute_ms);
CREATE INDEX telemetry_tenminutes_minute ON telemetry_tenminutes (minute_ms);

ALTER TABLE telemetry_hours ADD PRIMARY KEY (device, minute_ms);
CREATE INDEX telemetry_hours_node ON telemetry_hours (node_id, minute_ms);
CREATE INDEX telemetry_hours_minute ON telemetry_hours (minute_ms);

-- Who holds a device now (right-sizing counts the holders of the devices it judges, not of the fleet).
CREATE INDEX allocations_active_by_device ON allocations (device_uuid) WHERE state = 'active';
