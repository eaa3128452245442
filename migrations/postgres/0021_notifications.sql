-- Notifications. `events` is a transactional outbox: each row is written in the same transaction as the change it
-- tells of (beside its audit entry), so a rolled-back change has no event and a committed one always has. `id` is the
-- stable event id receivers de-duplicate with; `seq` orders events. `webhook_id` is set only on a test event meant for
-- one endpoint. The dispatcher turns each event into one delivery per matching webhook, then marks it dispatched.
CREATE TABLE events (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL,
    tenant_id TEXT,
    subject TEXT NOT NULL,
    at_ms BIGINT NOT NULL,
    data JSONB NOT NULL,
    webhook_id TEXT,
    dispatched BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX events_undispatched ON events (dispatched, seq);
CREATE INDEX events_by_tenant ON events (tenant_id, seq);
CREATE INDEX events_by_time ON events (at_ms);

-- The reminders sent: an active request is told once per lead time (`kind`, in ms) that its end is near.
CREATE TABLE reminders (
    request_id TEXT NOT NULL REFERENCES slice_requests (id) ON DELETE CASCADE,
    kind BIGINT NOT NULL,
    at_ms BIGINT NOT NULL,
    PRIMARY KEY (request_id, kind)
);

-- Webhook endpoints: a tenant's (tenant_id set) or platform-wide (NULL). `types` is a JSON array of event types or
-- `prefix.*` patterns (empty: every type). `secret` signs deliveries; after a rotation `previous_secret` signs them
-- too until `previous_until_ms`.
CREATE TABLE webhooks (
    id TEXT PRIMARY KEY,
    tenant_id TEXT REFERENCES tenants (id) ON DELETE CASCADE,
    url TEXT NOT NULL,
    format TEXT NOT NULL CHECK (format IN ('standard', 'slack')),
    types JSONB NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    secret TEXT NOT NULL,
    previous_secret TEXT,
    previous_until_ms BIGINT,
    created_by TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX webhooks_by_tenant ON webhooks (tenant_id);

-- One event to one endpoint. A delivery is claimed for `lease_until_ms` while it is sent, so that replicas never send
-- the same one at once; an endpoint gets a subject's events in order (a later one waits while an earlier one is
-- pending).
CREATE TABLE webhook_deliveries (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id TEXT NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event_seq BIGINT NOT NULL REFERENCES events (seq),
    subject TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts BIGINT NOT NULL DEFAULT 0,
    first_at_ms BIGINT NOT NULL,
    next_at_ms BIGINT NOT NULL,
    lease_until_ms BIGINT NOT NULL DEFAULT 0,
    last_status BIGINT,
    last_error TEXT NOT NULL DEFAULT '',
    delivered_at_ms BIGINT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_at_ms);
CREATE INDEX webhook_deliveries_by_webhook ON webhook_deliveries (webhook_id, id);
CREATE INDEX webhook_deliveries_order ON webhook_deliveries (webhook_id, subject, state, event_seq);
CREATE INDEX webhook_deliveries_by_event ON webhook_deliveries (event_seq);

-- How far each user has read their inbox: events up to this seq are read.
CREATE TABLE inbox_reads (
    user_id TEXT PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    seen_seq BIGINT NOT NULL
);
