-- Where the calendar's last simulation placed each accepted reservation's slices (a JSON array of
-- [gpu id, profile or sharing key, start]). Each simulation keeps a reservation on these slices while they are free at
-- its start, so that releasing anything never leaves an accepted reservation without room.
CREATE TABLE reservation_slices (
    reservation_id TEXT PRIMARY KEY REFERENCES reservations (id) ON DELETE CASCADE,
    slices TEXT NOT NULL
);
