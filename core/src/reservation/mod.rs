//! Reservations: slices booked for a window `[start, end)` ahead of time.
//!
//! A reservation is accepted only if the fleet can hold it at every moment of its window, together with every
//! reservation already accepted and every live allocation whose end is known (an allocation without an expiry is
//! taken to last for ever). From then on its capacity is protected: a new allocation that would leave an accepted
//! reservation without room is refused (the request waits with reason `reserved`, or is shortened to end before).
//!
//! [`Calendar::simulate`] replays the future: at each start of a reservation, in time order, it places that
//! reservation's slices with the planner (MIG) or the share packing (whole GPUs) on the fleet as it will be then —
//! instances whose holder has ended are free, slices placed for earlier reservations are held until their end. A
//! reservation whose slices find no place at its start is a shortfall. Admission, protection and previews all ask
//! the same question of one simulation, so they agree.
//!
//! ```text
//! pending ──approve──> accepted ──start (lead time)──> started ──end──> ended
//!    │ reject / cancel     │ cancel / fail                │ (its request is released early: ended)
//! ```

mod calendar;
mod place;
mod rules;
mod search;

pub use calendar::{Calendar, Prepared, Simulation};
pub use rules::{
    Booking, CalGpu, Hold, LEAD_MS, MIN_DURATION_S, ReservationError, ReservationPolicy, ReservationState,
    START_SLACK_MS, Shortfall, check_window, held_at, request_reason, share_of,
};
pub use search::{PREVIEW_COUNT, preview_limit, search_most};
