-- User names are unique regardless of letter case, so that `ADMIN` cannot sit beside `admin`.
CREATE UNIQUE INDEX users_name_lower ON users (lower(name));
