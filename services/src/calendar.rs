//! What the reservation calendar is built from ([`CalendarRead`]: live allocations with their known ends, accepted
//! reservations, where earlier simulations kept their slices), and the protection every approval runs: an
//! allocation may not leave an accepted reservation without room. The rules and the simulation are
//! `tessera_core::reservation`'s; reservations themselves (booking, deciding, the sweep) are `reservations.rs`'s.

use std::collections::HashMap;

use tessera_core::reservation::{Booking, CalGpu, Calendar, Hold, ReservationState, Shortfall};

use crate::app::AppState;
use crate::error::ApiError;
use crate::placement::FleetNow;
use tessera_store::reservations::{Holdings, ReservationRecord};
use tessera_store::{Guard, Reservation, SliceRequest, now_ms};

/// Accepted reservations a calendar reads at most.
pub(crate) const MAX_BOOKINGS: u32 = 100_000;

/// What a calendar is built from, read together (the holdings first: anything written after them is caught).
#[derive(Debug, Clone)]
pub struct CalendarRead {
    /// The calendar's version and the live allocations, as read.
    pub holdings: Holdings,
    /// Accepted reservations that have not ended.
    pub bookings: Vec<Booking>,
    /// Request id -> (starts_at_ms, ends_by_ms) for live requests bounded in time.
    windows: HashMap<String, (Option<i64>, Option<i64>)>,
    /// Request id -> the reservation it was made for.
    made_for: HashMap<String, String>,
    /// Accepted reservation id -> its tenant's id.
    pub(crate) owners: HashMap<String, String>,
    /// Accepted reservation id -> the slices the last simulation placed it on.
    hints: HashMap<String, Vec<Hold>>,
}

impl CalendarRead {
    /// Reads the calendar's version, accepted reservations and bounded requests.
    pub async fn read(state: &AppState) -> Result<CalendarRead, ApiError> {
        // The version first: what is read after it is at least as new, so a change after it is seen by whoever
        // compares versions. The rest at once.
        let holdings = state.store.holdings().await?;
        let now = now_ms();
        let (accepted, rows, hints) = tokio::try_join!(
            async {
                let states = [ReservationState::Accepted];
                Ok::<_, ApiError>(state.store.reservations(None, &states, now, i64::MAX, MAX_BOOKINGS).await?)
            },
            async { Ok::<_, ApiError>(state.store.request_windows().await?) },
            kept_slices(state),
        )?;
        let owners = accepted.iter().map(|r| (r.id.clone(), r.tenant_id.clone())).collect();
        let bookings = accepted.into_iter().map(booking).collect();
        let made_for = rows.iter().filter_map(|(id, _, _, r)| Some((id.clone(), r.clone()?))).collect();
        let windows = rows.into_iter().map(|(id, s, e, _)| (id, (s, e))).collect();
        Ok(CalendarRead { holdings, bookings, windows, made_for, owners, hints })
    }

    /// When request `id` may start and must end by, if bounded.
    pub fn window(&self, id: &str) -> (Option<i64>, Option<i64>) {
        self.windows.get(id).copied().unwrap_or((None, None))
    }

    /// The calendar of `fleet`, whose live allocations belong to `live` requests: each held until its request
    /// expires or must end, else for ever.
    pub fn calendar(&self, state: &AppState, fleet: &FleetNow, live: &[SliceRequest]) -> Calendar<'static> {
        let ends: HashMap<&str, Option<i64>> =
            live.iter().map(|r| (r.id.as_str(), r.expires_at_ms.or_else(|| self.window(&r.id).1))).collect();
        let holds = fleet
            .live
            .iter()
            .map(|a| Hold {
                gpu: a.gpu_id.clone(),
                profile: a.profile.clone(),
                start: a.start,
                until_ms: ends.get(a.request_id.as_str()).copied().flatten(),
            })
            .collect();
        Calendar::new(state.catalog, gpus(fleet), holds, self.bookings.clone()).with_hints(self.hints.clone())
    }

    /// Whether placing `request`'s slices at `placed` leaves every accepted reservation its room: the guard its
    /// approval commits with (and the time it must end by, when a duration lets it end before a reservation that
    /// needs its room), or `409 reserved`.
    pub async fn guard(
        &self,
        state: &AppState,
        fleet: &FleetNow,
        request: &SliceRequest,
        placed: &[Reservation],
    ) -> Result<Guard, ApiError> {
        let free = Guard { bookings_version: self.holdings.bookings_version, ends_by_ms: None };
        if !self.any_ahead() || placed.is_empty() {
            return Ok(free);
        }
        let live = state.store.placed_requests().await?;
        let bounded = self.window(&request.id).1.or(request.expires_at_ms);
        match self.protect(state, fleet, &live, bounded, request.duration_s.is_some(), placed) {
            Ok(ends_by_ms) => Ok(Guard { ends_by_ms, ..free }),
            Err(s) => Err(reserved(&s)),
        }
    }

    /// The id of the tenant that made the accepted reservation `id`.
    pub fn owner(&self, id: &str) -> Option<&str> {
        self.owners.get(id).map(String::as_str)
    }

    /// Whether any accepted reservation has not ended.
    pub fn any_ahead(&self) -> bool {
        let now = now_ms();
        self.bookings.iter().any(|b| b.end_ms > now)
    }

    /// [`CalendarRead::guard`]'s decision on `live` requests for slices at `placed` held until `bounded` (`None`:
    /// not known): `Ok(None)` when they may stay as long as they like, `Ok(Some(t))` when they must end by `t` (only
    /// for a request with a duration), or the reservation they would leave short.
    pub fn protect(
        &self,
        state: &AppState,
        fleet: &FleetNow,
        live: &[SliceRequest],
        bounded: Option<i64>,
        has_duration: bool,
        placed: &[Reservation],
    ) -> Result<Option<i64>, Shortfall> {
        let now = now_ms();
        let cal = self.calendar(state, fleet, live);
        let holds = |until_ms: Option<i64>| -> Vec<Hold> {
            placed
                .iter()
                .map(|r| Hold { gpu: r.gpu_id.clone(), profile: r.profile.clone(), start: r.start, until_ms })
                .collect()
        };
        if placed.is_empty() || cal.bookings().iter().all(|b| b.end_ms <= now) {
            return Ok(None);
        }
        let prepared = state.prepared.prepare(&cal, now);
        let forever = match prepared.protects(&holds(bounded)) {
            Ok(()) => return Ok(None),
            Err(s) => s,
        };
        if bounded.is_none() && has_duration && prepared.protects(&holds(Some(forever.start_ms))).is_ok() {
            return Ok(Some(forever.start_ms));
        }
        Err(forever)
    }

    /// The reservation request `id` was made for, and its start, if the start is still ahead.
    pub fn not_before(&self, id: &str) -> Option<(String, i64)> {
        let (starts, _) = self.window(id);
        let reservation = self.made_for.get(id)?;
        starts.filter(|s| *s > now_ms()).map(|s| (reservation.clone(), s))
    }
}

/// `409 reserved`: the capacity is booked by an accepted reservation from `s.start_ms`.
pub fn reserved(s: &Shortfall) -> ApiError {
    ApiError::Conflict {
        code: "reserved",
        detail: format!(
            "reservation {} needs this capacity from {}; ask for a duration that ends before then, or wait until it \
             ends",
            s.booking,
            tessera_core::clock::utc_minute(s.start_ms)
        ),
        errors: vec![],
    }
}

/// A reservation's kept slices as stored: `[[gpu, profile or sharing key, start], ...]`.
fn slices_to_json(slices: &[Hold]) -> String {
    let rows: Vec<(&str, &str, u8)> = slices.iter().map(|h| (h.gpu.as_str(), h.profile.as_str(), h.start)).collect();
    serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_string())
}

/// [`slices_to_json`]'s form read back (`None` when it is not that form: the reservation is then planned anew).
fn slices_from_json(json: &str) -> Option<Vec<Hold>> {
    let rows: Vec<(String, String, u8)> = serde_json::from_str(json).ok()?;
    Some(rows.into_iter().map(|(gpu, profile, start)| Hold { gpu, profile, start, until_ms: None }).collect())
}

/// Where the calendar's simulations kept each accepted reservation's slices, by reservation id.
pub(crate) async fn kept_slices(state: &AppState) -> Result<HashMap<String, Vec<Hold>>, ApiError> {
    Ok(state
        .store
        .reservation_slices()
        .await?
        .into_iter()
        .filter_map(|(id, json)| Some((id, slices_from_json(&json)?)))
        .collect())
}

/// Simulates the calendar as it is and keeps where each accepted reservation's slices went, for the reservations
/// whose placement changed: the next simulation keeps them there while those slices are free (see
/// [`Calendar::with_hints`]). Run after every acceptance and by the sweep (a cancellation only frees room, so the
/// kept slices stay free).
pub async fn keep_slices(state: &AppState) -> Result<(), ApiError> {
    let read = CalendarRead::read(state).await?;
    if read.bookings.is_empty() {
        return Ok(());
    }
    let fleet = FleetNow::read(state).await?;
    let live = state.store.placed_requests().await?;
    let sim = state.prepared.simulate(&read.calendar(state, &fleet, &live), now_ms());
    let changed: Vec<(String, String)> = sim
        .placed
        .into_iter()
        .filter(|(id, slices)| {
            let same = |kept: &Vec<Hold>| {
                kept.len() == slices.len()
                    && kept
                        .iter()
                        .zip(slices)
                        .all(|(a, b)| (&a.gpu, &a.profile, a.start) == (&b.gpu, &b.profile, b.start))
            };
            !slices.is_empty() && !read.hints.get(id).is_some_and(same)
        })
        .map(|(id, slices)| (id, slices_to_json(&slices)))
        .collect();
    Ok(state.store.set_reservation_slices(&changed).await?)
}

fn booking(r: ReservationRecord) -> Booking {
    Booking { id: r.id, spec: r.spec, count: r.count, start_ms: r.start_ms, end_ms: r.end_ms }
}

/// The calendar's GPUs from the fleet as read.
fn gpus(fleet: &FleetNow) -> Vec<CalGpu> {
    fleet
        .nodes
        .iter()
        .flat_map(|n| n.gpus.iter())
        .map(|g| CalGpu {
            id: g.id.clone(),
            node: g.node_id.clone(),
            model: g.model.clone(),
            mig: g.mig_enabled,
            cordoned: g.cordoned,
            layout: g.layout.iter().map(|i| (i.profile.clone(), i.start)).collect(),
        })
        .collect()
}
