-- The quota standing's ended hours, worked out once: per resource, hour and tenant, the most the tenant held at once
-- in that hour and what it used on average (thousandths). A row with an empty tenant says the hour is worked out for
-- that resource (a tenant that held nothing in it has no row). The standing's 30 days then read these rows and the
-- requests of the hours since the last one kept, on every replica and after every restart, instead of 30 days of
-- requests and allocations on each replica's first standing. An hour that has ended does not change (a request
-- holds from its creation until it ends, an allocation is used from its activation until its release, both written
-- when they happen), so replicas that work out the same hour write the same rows; the second write is ignored.
CREATE TABLE standing_hours (
    resource TEXT NOT NULL,
    hour_ms BIGINT NOT NULL,
    tenant_id TEXT NOT NULL,
    peak_milli BIGINT NOT NULL,
    used_milli DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (resource, hour_ms, tenant_id)
);
