-- One-time sign-in links: `tessera serve` prints one for the bootstrap admin while it has no other way in,
-- `tessera user sign-in-link` and platform admins issue them (e.g. for a user just created, who then sets a
-- password). Only the secret's SHA-256 is kept; a link works once (taking it deletes it) and until its expiry.
-- A user has at most one link: issuing a new one replaces the old.

CREATE TABLE sign_in_links (
    secret_sha256 TEXT PRIMARY KEY,
    user_id TEXT NOT NULL UNIQUE REFERENCES users (id) ON DELETE CASCADE,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL
);
CREATE INDEX sign_in_links_expiry ON sign_in_links (expires_at_ms);
