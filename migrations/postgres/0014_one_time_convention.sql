-- One convention on both backends, so that one SQL body serves SQLite and PostgreSQL: every time is UTC
-- milliseconds in a BIGINT column named `<name>_ms` (the sign-in, agent and telemetry tables already were), and
-- every integer is BIGINT. Existing rows keep their values: a timestamptz becomes its epoch milliseconds, rounded
-- as the store has always read it.

ALTER TABLE tenants ALTER COLUMN created_at TYPE BIGINT USING (extract(epoch FROM created_at) * 1000)::bigint;
ALTER TABLE tenants RENAME COLUMN created_at TO created_at_ms;
ALTER TABLE tenants ALTER COLUMN auto_approve_max_compute_slices TYPE BIGINT;

ALTER TABLE slice_requests ALTER COLUMN created_at TYPE BIGINT USING (extract(epoch FROM created_at) * 1000)::bigint;
ALTER TABLE slice_requests RENAME COLUMN created_at TO created_at_ms;
ALTER TABLE slice_requests ALTER COLUMN updated_at TYPE BIGINT USING (extract(epoch FROM updated_at) * 1000)::bigint;
ALTER TABLE slice_requests RENAME COLUMN updated_at TO updated_at_ms;
ALTER TABLE slice_requests ALTER COLUMN expires_at TYPE BIGINT USING (extract(epoch FROM expires_at) * 1000)::bigint;
ALTER TABLE slice_requests RENAME COLUMN expires_at TO expires_at_ms;
ALTER TABLE slice_requests ALTER COLUMN count TYPE BIGINT;

ALTER TABLE audit_log ALTER COLUMN at TYPE BIGINT USING (extract(epoch FROM at) * 1000)::bigint;
ALTER TABLE audit_log RENAME COLUMN at TO at_ms;

ALTER TABLE users ALTER COLUMN created_at TYPE BIGINT USING (extract(epoch FROM created_at) * 1000)::bigint;
ALTER TABLE users RENAME COLUMN created_at TO created_at_ms;

ALTER TABLE api_tokens ALTER COLUMN created_at TYPE BIGINT USING (extract(epoch FROM created_at) * 1000)::bigint;
ALTER TABLE api_tokens RENAME COLUMN created_at TO created_at_ms;
ALTER TABLE api_tokens ALTER COLUMN revoked_at TYPE BIGINT USING (extract(epoch FROM revoked_at) * 1000)::bigint;
ALTER TABLE api_tokens RENAME COLUMN revoked_at TO revoked_at_ms;

ALTER TABLE nodes ALTER COLUMN created_at TYPE BIGINT USING (extract(epoch FROM created_at) * 1000)::bigint;
ALTER TABLE nodes RENAME COLUMN created_at TO created_at_ms;

ALTER TABLE gpus ALTER COLUMN idx TYPE BIGINT;

ALTER TABLE layout_proposals ALTER COLUMN created_at TYPE BIGINT USING (extract(epoch FROM created_at) * 1000)::bigint;
ALTER TABLE layout_proposals RENAME COLUMN created_at TO created_at_ms;
ALTER TABLE layout_proposals ALTER COLUMN decided_at TYPE BIGINT USING (extract(epoch FROM decided_at) * 1000)::bigint;
ALTER TABLE layout_proposals RENAME COLUMN decided_at TO decided_at_ms;

ALTER TABLE allocations ALTER COLUMN created_at TYPE BIGINT USING (extract(epoch FROM created_at) * 1000)::bigint;
ALTER TABLE allocations RENAME COLUMN created_at TO created_at_ms;
ALTER TABLE allocations ALTER COLUMN start TYPE BIGINT;
