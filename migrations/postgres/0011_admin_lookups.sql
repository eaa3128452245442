-- Lookups of the admin views: an object's audit history (newest first) and a user's API tokens.

CREATE INDEX audit_log_object ON audit_log (object, id);
CREATE INDEX api_tokens_user ON api_tokens (user_id);
