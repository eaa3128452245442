-- E-mail notifications. `email_prefs` holds the event types each user chose to be mailed about (a JSON array of types
-- or `prefix.*` patterns; an empty array, or no row: none). A user is mailed only events they may read in the inbox,
-- and only those made after they chose (`since_ms`).
CREATE TABLE email_prefs (
    user_id TEXT PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
    types TEXT NOT NULL,
    since_ms INTEGER NOT NULL
);

-- One event to one user's address. The sender claims due rows for `lease_until_ms` (one replica sends each) and sends
-- a user's due rows as one message.
CREATE TABLE email_deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    address TEXT NOT NULL,
    event_seq INTEGER NOT NULL REFERENCES events (seq),
    state TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    first_at_ms INTEGER NOT NULL,
    next_at_ms INTEGER NOT NULL,
    lease_until_ms INTEGER NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    delivered_at_ms INTEGER
);
CREATE INDEX email_deliveries_due ON email_deliveries (state, next_at_ms);
CREATE INDEX email_deliveries_by_user ON email_deliveries (user_id, id);
CREATE INDEX email_deliveries_by_event ON email_deliveries (event_seq);

-- What each node's events last told: the spec generation whose outcome was told (`layout.applied` or
-- `layout.failed`) and whether it was applied without error; whether the node was ready (NULL: not yet judged).
ALTER TABLE nodes ADD COLUMN told_generation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN told_ok INTEGER NOT NULL DEFAULT 1;
ALTER TABLE nodes ADD COLUMN told_ready INTEGER;

-- Findings told once: a key per finding (`idle/<allocation>`, `budget/<tenant>/<unit>/<month start>/<level>`) whose
-- event was written. An idle allocation's key goes once it is used again, so a later idle spell is told again.
CREATE TABLE notices (
    key TEXT PRIMARY KEY,
    at_ms INTEGER NOT NULL
);
