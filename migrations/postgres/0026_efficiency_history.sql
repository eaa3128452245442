-- Prices per GPU-hour per catalog model, in one currency, set by platform admins: what held and wasted capacity
-- costs in the efficiency report and its history.
CREATE TABLE gpu_prices (
    model TEXT PRIMARY KEY,
    currency TEXT NOT NULL,
    per_gpu_hour DOUBLE PRECISION NOT NULL CHECK (per_gpu_hour >= 0),
    updated_at_ms BIGINT NOT NULL,
    updated_by TEXT NOT NULL
);

-- MIG capacity per model, one sample per sampling slot: replicas sampling the same slot write one row.
CREATE TABLE capacity_samples (
    slot_ms BIGINT NOT NULL,
    model TEXT NOT NULL,
    gpus BIGINT NOT NULL,
    allocated BIGINT NOT NULL,
    placeable BIGINT NOT NULL,
    stranded BIGINT NOT NULL,
    cordoned BIGINT NOT NULL,
    PRIMARY KEY (slot_ms, model)
);

-- Per UTC day and model: compute-slice-hours held, measured and used, and GPU-hours held and wasted
-- (measured but unused), rewritten as the day goes on and once more after it ends.
CREATE TABLE efficiency_days (
    day_ms BIGINT NOT NULL,
    model TEXT NOT NULL,
    held_slice_hours DOUBLE PRECISION NOT NULL,
    measured_slice_hours DOUBLE PRECISION NOT NULL,
    used_slice_hours DOUBLE PRECISION NOT NULL,
    held_gpu_hours DOUBLE PRECISION NOT NULL,
    wasted_gpu_hours DOUBLE PRECISION NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    PRIMARY KEY (day_ms, model)
);

-- The health changes a heatmap marks, read by type and time.
CREATE INDEX events_by_type_time ON events (type, at_ms);
