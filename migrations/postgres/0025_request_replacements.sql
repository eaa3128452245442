-- A request made to replace another (right-sizing's "request the smaller slice"): when it turns active, the request
-- it replaces is released in the same transaction.
CREATE TABLE request_replacements (
    request_id TEXT PRIMARY KEY REFERENCES slice_requests (id),
    replaces_request_id TEXT NOT NULL REFERENCES slice_requests (id),
    created_at_ms BIGINT NOT NULL
);

CREATE INDEX request_replacements_replaces ON request_replacements (replaces_request_id);
