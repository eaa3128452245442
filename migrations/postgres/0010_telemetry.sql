-- Telemetry downsampled to one row per device and minute (the live 1 s window is kept in memory only). Rows from
-- two replicas or a late backlog for the same minute are merged (sample-weighted), never duplicated.

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
    PRIMARY KEY (device, minute_ms)
);

CREATE INDEX telemetry_minutes_node ON telemetry_minutes (node_id, minute_ms);
CREATE INDEX telemetry_minutes_minute ON telemetry_minutes (minute_ms);
