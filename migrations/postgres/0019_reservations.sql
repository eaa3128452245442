-- Reservations: slices booked for a window [start_ms, end_ms) ahead; their charges (quota is checked for the
-- window); per-tenant or global limits on what may be booked ('*' is every tenant); and the calendar's versions,
-- which serialise admissions with each other (bookings_version) and with approvals that place slices.
-- A request made for a reservation is not active before starts_at_ms, and ends by ends_by_ms (also set on a request
-- an approval limited to end before a reservation it would otherwise leave without room).

CREATE TABLE reservations (
    id TEXT PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants (id),
    spec JSONB NOT NULL,
    count BIGINT NOT NULL CHECK (count > 0),
    start_ms BIGINT NOT NULL,
    end_ms BIGINT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'accepted', 'started', 'ended', 'rejected', 'cancelled', 'failed')),
    reason TEXT NOT NULL DEFAULT '',
    decision TEXT NOT NULL DEFAULT '',
    request_id TEXT REFERENCES slice_requests (id),
    version BIGINT NOT NULL DEFAULT 1,
    created_by TEXT NOT NULL,
    decided_by TEXT,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    CHECK (end_ms > start_ms)
);
CREATE INDEX reservations_by_state ON reservations (state, start_ms);
CREATE INDEX reservations_by_tenant ON reservations (tenant_id, start_ms);

CREATE TABLE reservation_charges (
    reservation_id TEXT NOT NULL REFERENCES reservations (id) ON DELETE CASCADE,
    resource TEXT NOT NULL,
    amount_milli BIGINT NOT NULL CHECK (amount_milli >= 0),
    PRIMARY KEY (reservation_id, resource)
);

CREATE TABLE reservation_policies (
    scope TEXT PRIMARY KEY,
    max_duration_s BIGINT NOT NULL CHECK (max_duration_s > 0),
    max_ahead_s BIGINT NOT NULL CHECK (max_ahead_s >= 0),
    max_concurrent BIGINT NOT NULL CHECK (max_concurrent >= 0)
);

CREATE TABLE reservation_calendar (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    bookings_version BIGINT NOT NULL DEFAULT 0
);
INSERT INTO reservation_calendar (id) VALUES (1);

ALTER TABLE slice_requests ADD COLUMN starts_at_ms BIGINT;
ALTER TABLE slice_requests ADD COLUMN ends_by_ms BIGINT;
ALTER TABLE slice_requests ADD COLUMN reservation_id TEXT;
