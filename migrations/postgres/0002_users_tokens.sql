-- People, their tenant memberships, and API tokens (only a SHA-256 of the secret is stored).

CREATE TABLE users (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    platform_admin BOOLEAN NOT NULL DEFAULT FALSE,
    created_at TIMESTAMPTZ NOT NULL
);

CREATE TABLE memberships (
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    tenant_id TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('member', 'tenant-admin')),
    PRIMARY KEY (user_id, tenant_id)
);

CREATE TABLE api_tokens (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    secret_sha256 TEXT NOT NULL UNIQUE,
    created_at TIMESTAMPTZ NOT NULL,
    revoked_at TIMESTAMPTZ
);

CREATE TABLE idempotency_keys (
    user_id TEXT NOT NULL,
    key TEXT NOT NULL,
    request_id TEXT NOT NULL REFERENCES slice_requests (id) ON DELETE CASCADE,
    PRIMARY KEY (user_id, key)
);
