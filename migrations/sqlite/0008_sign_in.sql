-- Sign-in: identities from the OpenID provider, local passwords (argon2), browser sessions, login attempts in
-- flight and node credentials. Times of sign-in records are UTC milliseconds on both backends.

ALTER TABLE users ADD COLUMN email TEXT;
ALTER TABLE users ADD COLUMN password_hash TEXT;
ALTER TABLE users ADD COLUMN oidc_issuer TEXT;
ALTER TABLE users ADD COLUMN oidc_subject TEXT;
CREATE UNIQUE INDEX users_oidc_identity ON users (oidc_issuer, oidc_subject) WHERE oidc_subject IS NOT NULL;

-- `sso` memberships come from the provider's claims and are re-evaluated at each sign-in; `local` ones are set
-- through the API and left alone by sign-in.
ALTER TABLE memberships ADD COLUMN source TEXT NOT NULL DEFAULT 'local' CHECK (source IN ('local', 'sso'));

CREATE TABLE sessions (
    id_sha256 TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    csrf_token TEXT NOT NULL,
    id_token TEXT,
    created_at_ms INTEGER NOT NULL,
    last_seen_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
CREATE INDEX sessions_user ON sessions (user_id);
CREATE INDEX sessions_expiry ON sessions (expires_at_ms);

CREATE TABLE login_attempts (
    state_sha256 TEXT PRIMARY KEY,
    browser_sha256 TEXT NOT NULL,
    nonce TEXT NOT NULL,
    pkce_verifier TEXT NOT NULL,
    return_to TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL
);

CREATE TABLE node_credentials (
    id TEXT PRIMARY KEY,
    node_id TEXT NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    secret_sha256 TEXT NOT NULL UNIQUE,
    created_at_ms INTEGER NOT NULL,
    revoked_at_ms INTEGER
);
CREATE INDEX node_credentials_node ON node_credentials (node_id);
