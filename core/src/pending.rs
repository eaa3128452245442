//! Why a request waits: one reason from a fixed list, with what it depends on, decided from facts the server
//! gathers (the quota now, reclaim notices, the tenant's policy, what the planner says of the fleet now, the layout
//! proposals, nodes and GPUs its slices are on). The same rules answer a preview of a request not yet made.
//!
//! A pending request waits, in this order of precedence, for: its tenant to be back under a limit
//! (`quota_exceeded`), borrowed capacity being taken back for it (`waiting_for_reclaim`), room on the fleet
//! (`no_capacity`, each model marked `fragmented` when its free compute slices would be enough but no legal
//! placement exists), or an
//! admin (`awaiting_approval`); one its tenant's policy approves, with room, is placed at the next sweep (`queued`). An approved request waits for a layout change an admin must approve
//! (`layout_awaiting_approval`), a cordoned GPU (`gpu_cordoned`), a node that is not ready (`node_not_ready`), or the
//! node's agent applying it (`being_applied`).

use serde::{Deserialize, Serialize};

use crate::request::RequestState;

/// Why a request waits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum WaitReason {
    /// A platform admin must approve it: the tenant's policy does not approve it on its own.
    AwaitingApproval {
        /// Who can approve it (platform admins' names; at most 10).
        approvers: Vec<String>,
    },
    /// The tenant's policy approves it and the fleet has room: the server's next sweep places it (within 15 s).
    Queued,
    /// The tenant holds more than a limit allows now (a limit was lowered or a temporary increase ended): it waits
    /// until the tenant is back under.
    QuotaExceeded {
        /// Resource key.
        resource: String,
        /// What the tenant holds, this request included.
        held: f64,
        /// What this request charges.
        requested: f64,
        /// The limit (the maximum, in a cohort).
        limit: f64,
    },
    /// The fleet has no room for it now.
    NoCapacity {
        /// Per GPU model it may use: what is free and what it needs.
        models: Vec<ModelRoom>,
    },
    /// Capacity its tenant lent is being taken back for it; it can be placed once released.
    WaitingForReclaim {
        /// When the last borrowed request taken back for it is released, UTC milliseconds.
        until_ms: i64,
    },
    /// A layout change it needs waits for a platform admin.
    LayoutAwaitingApproval {
        /// The layout proposal's id.
        proposal: String,
        /// The GPU's id.
        gpu: String,
    },
    /// A GPU its slices are on is cordoned: nothing new starts there until it is uncordoned.
    GpuCordoned {
        /// The GPU's id.
        gpu: String,
    },
    /// The node its slices are on has not been heard from: the slices start once it is back.
    NodeNotReady {
        /// The node's name.
        node: String,
    },
    /// The node's agent is applying its configuration.
    BeingApplied {
        /// The node's name.
        node: String,
    },
    /// Placing it now would leave an accepted reservation without room: it waits until that reservation ends (a
    /// request with a duration ending before the reservation's start is placed, limited to end by then).
    Reserved {
        /// The reservation's id; `null` when it is a reservation of a tenant the caller is not in (a platform admin
        /// sees every id).
        reservation: Option<String>,
        /// When the reservation starts, UTC milliseconds.
        starts_at_ms: i64,
    },
    /// It was made for a reservation whose window has not begun: its slices are prepared ahead and turn active at
    /// the start.
    ReservationNotStarted {
        /// The reservation's id.
        reservation: String,
        /// When the window begins, UTC milliseconds.
        starts_at_ms: i64,
    },
}

impl WaitReason {
    /// The stable code (`awaiting_approval`, ...), as serialized.
    pub fn code(&self) -> &'static str {
        match self {
            WaitReason::AwaitingApproval { .. } => "awaiting_approval",
            WaitReason::Queued => "queued",
            WaitReason::QuotaExceeded { .. } => "quota_exceeded",
            WaitReason::NoCapacity { .. } => "no_capacity",
            WaitReason::WaitingForReclaim { .. } => "waiting_for_reclaim",
            WaitReason::LayoutAwaitingApproval { .. } => "layout_awaiting_approval",
            WaitReason::GpuCordoned { .. } => "gpu_cordoned",
            WaitReason::NodeNotReady { .. } => "node_not_ready",
            WaitReason::BeingApplied { .. } => "being_applied",
            WaitReason::Reserved { .. } => "reserved",
            WaitReason::ReservationNotStarted { .. } => "reservation_not_started",
        }
    }

    /// Every code, for counting requests by reason (`tessera_pending_requests{reason}`).
    pub const CODES: [&'static str; 11] = [
        "awaiting_approval",
        "queued",
        "quota_exceeded",
        "no_capacity",
        "waiting_for_reclaim",
        "layout_awaiting_approval",
        "gpu_cordoned",
        "node_not_ready",
        "being_applied",
        "reserved",
        "reservation_not_started",
    ];

    /// The reason as a sentence.
    pub fn sentence(&self) -> String {
        let n = |v: f64| crate::clock::rounded(v, 1);
        match self {
            WaitReason::AwaitingApproval { approvers } if approvers.is_empty() => {
                "It waits for a platform admin to approve it.".to_string()
            }
            WaitReason::AwaitingApproval { approvers } => {
                format!("It waits for a platform admin to approve it ({}).", approvers.join(", "))
            }
            WaitReason::Queued => {
                "Its tenant's policy approves it and there is room: it is placed within seconds.".to_string()
            }
            WaitReason::QuotaExceeded { resource, held, requested, limit } => format!(
                "The tenant holds {} of {resource} with this request, over its limit of {} (this request asks {}): it \
                 waits until the tenant is back under.",
                n(*held),
                n(*limit),
                n(*requested)
            ),
            WaitReason::NoCapacity { models } => {
                let parts: Vec<String> = models
                    .iter()
                    .map(|m| {
                        let free = format!(
                            "{}: {} compute slices free, {} needed",
                            m.model,
                            n(m.free_slices),
                            n(m.needed_slices)
                        );
                        let text = match (m.fragmented, room_changes_sentence(&m.make_room)) {
                            (true, Some(change)) => format!("{free}, but scattered so that no instance fits; {change}"),
                            (true, None) => format!("{free}, but scattered so that no instance fits"),
                            (false, _) => free,
                        };
                        match m.held_back.sentence() {
                            Some(held) => format!("{text}; not taking new work: {held}"),
                            None => text,
                        }
                    })
                    .collect();
                if parts.is_empty() {
                    "No GPU of the fleet can take it.".to_string()
                } else {
                    format!("The fleet has no room for it now ({}).", parts.join("; "))
                }
            }
            WaitReason::WaitingForReclaim { until_ms } => format!(
                "Capacity the tenant lent is being taken back for it, until {} (UTC).",
                crate::clock::utc_minute(*until_ms)
            ),
            WaitReason::LayoutAwaitingApproval { proposal, .. } => {
                format!("A layout change it needs (proposal {proposal}) waits for a platform admin.")
            }
            WaitReason::GpuCordoned { gpu } => format!("The GPU it is on ({gpu}) is cordoned."),
            WaitReason::NodeNotReady { node } => {
                format!("Node {node} has not been heard from; it starts once the node is back.")
            }
            WaitReason::BeingApplied { node } => format!("Node {node} is applying it."),
            WaitReason::Reserved { reservation, starts_at_ms } => format!(
                "Its room is booked by {} from {} (UTC): it waits until that ends; a request with a duration ending \
                 before then is placed at once.",
                match reservation {
                    Some(id) => format!("reservation {id}"),
                    None => "another tenant's reservation".to_string(),
                },
                crate::clock::utc_minute(*starts_at_ms)
            ),
            WaitReason::ReservationNotStarted { reservation, starts_at_ms } => format!(
                "It is made for reservation {reservation}: its slices are prepared ahead and become usable at {} (UTC).",
                crate::clock::utc_minute(*starts_at_ms)
            ),
        }
    }
}

/// What one GPU model has free for a waiting request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelRoom {
    /// Catalog model key.
    pub model: String,
    /// Compute slices free on GPUs of the model that take new work.
    pub free_slices: f64,
    /// Compute slices the request needs.
    pub needed_slices: f64,
    /// The free slices would be enough, but no legal placement of the request exists among them.
    pub fragmented: bool,
    /// When `fragmented`: the layout changes that would make room by moving instances in use (each move restarts
    /// its holder's work, so a platform admin decides); empty when moving instances cannot make room either.
    #[serde(default)]
    pub make_room: Vec<RoomChange>,
    /// GPUs of the model that take no new work now, each counted once under its first cause: cordoned, on a node
    /// not heard from, or with a layout change waiting for approval, with the compute slices free on them (not
    /// counted in `free_slices`).
    #[serde(default)]
    pub held_back: HeldBack,
}

/// GPUs that take no new work now, by cause, and the compute slices free on them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeldBack {
    /// Cordoned GPUs.
    pub cordoned: u32,
    /// GPUs on a node that has not been heard from.
    pub node_not_ready: u32,
    /// GPUs with a layout change waiting for a platform admin.
    pub layout_pending: u32,
    /// Compute slices free on these GPUs.
    pub free_slices: f64,
}

impl HeldBack {
    /// `1 GPU cordoned, 2 GPUs with a layout change waiting for approval; 9 compute slices free there`; `None` when
    /// no GPU is held back.
    pub fn sentence(&self) -> Option<String> {
        let gpus = |n: u32| if n == 1 { "1 GPU".to_string() } else { format!("{n} GPUs") };
        let mut parts = Vec::new();
        if self.cordoned > 0 {
            parts.push(format!("{} cordoned", gpus(self.cordoned)));
        }
        if self.node_not_ready > 0 {
            parts.push(format!("{} on a node not heard from", gpus(self.node_not_ready)));
        }
        if self.layout_pending > 0 {
            parts.push(format!("{} with a layout change waiting for approval", gpus(self.layout_pending)));
        }
        if parts.is_empty() {
            return None;
        }
        let free = crate::clock::rounded(self.free_slices, 1);
        Some(format!("{}; {free} compute slices free there", parts.join(", ")))
    }
}

/// One GPU laid out again, moving instances in use, so that more of a profile fits on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RoomChange {
    /// The GPU's id.
    pub gpu: String,
    /// The GPU's index on its node.
    pub index: u32,
    /// Its node's name.
    pub node: String,
    /// Instances in use that move (their profiles stay; only where they start changes).
    pub moves: Vec<InstanceMove>,
    /// Instances of the profile asked for that fit on the GPU afterwards.
    pub fits: u32,
    /// The GPU's instances in use after the moves, with the new instances: a layout an admin can propose.
    pub layout: Vec<crate::layout::PlacedInstance>,
}

/// An instance in use moved to another start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstanceMove {
    /// The request it serves; `null` when that request is of a tenant the caller is not in (a platform admin sees
    /// every id).
    pub request: Option<String>,
    /// Its profile.
    pub profile: String,
    /// Where it starts now.
    pub from: u8,
    /// Where it would start.
    pub to: u8,
}

/// The layout changes in words: `moving 1 instance in use would make room (GPU 0 of node-a: 1g.10gb from unit 4 to
/// 1)`; at most three moves are spelled out.
pub fn room_changes_sentence(changes: &[RoomChange]) -> Option<String> {
    let moves: usize = changes.iter().map(|c| c.moves.len()).sum();
    if moves == 0 {
        return None;
    }
    let spelled: Vec<String> = changes
        .iter()
        .flat_map(|c| {
            c.moves
                .iter()
                .map(move |m| format!("GPU {} of {}: {} from unit {} to {}", c.index, c.node, m.profile, m.from, m.to))
        })
        .take(3)
        .collect();
    let more = if moves > spelled.len() { format!("; {} more", moves - spelled.len()) } else { String::new() };
    let plural = if moves == 1 { "" } else { "s" };
    Some(format!(
        "moving {moves} instance{plural} in use would make room ({}{more}), which restarts their holders' work: a \
         platform admin decides",
        spelled.join("; ")
    ))
}

/// What the planner says of a pending request on the fleet now.
#[derive(Debug, Clone, PartialEq)]
pub enum Room {
    /// It can be placed now.
    Placeable,
    /// It cannot, with what each model has free.
    Unplaceable(Vec<ModelRoom>),
}

/// Where one of an approved request's slices stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceFacts {
    /// An open layout proposal it waits for, if any.
    pub proposal: Option<String>,
    /// Its GPU's id.
    pub gpu: String,
    /// Whether its GPU is cordoned.
    pub cordoned: bool,
    /// Its node's name.
    pub node: String,
    /// Whether its node is ready.
    pub node_ready: bool,
}

/// What the server knows of a request, to say why it waits.
#[derive(Debug, Clone, PartialEq)]
pub struct Facts {
    /// Its state.
    pub state: RequestState,
    /// A limit its tenant is over now, this request included: `(resource, held, requested, limit)`.
    pub over_quota: Option<(String, f64, f64, f64)>,
    /// When borrowed capacity taken back for its tenant is released, if any is being taken back.
    pub reclaim_until: Option<i64>,
    /// Whether its tenant's policy approves it on its own.
    pub auto_approves: bool,
    /// What the planner says (pending requests).
    pub room: Room,
    /// Who can approve it.
    pub approvers: Vec<String>,
    /// Its slices (approved and provisioning requests).
    pub slices: Vec<SliceFacts>,
    /// Placing it now would leave this accepted reservation `(id, start)` without room (no id: another tenant's
    /// reservation, not to be named to the caller).
    pub reserved: Option<(Option<String>, i64)>,
    /// It was made for this reservation `(id, start)`, whose window has not begun.
    pub not_before: Option<(String, i64)>,
}

/// Why a request waits; `None` when it does not (active, or ended).
pub fn reason(f: &Facts) -> Option<WaitReason> {
    match f.state {
        RequestState::Pending => Some(pending(f)),
        RequestState::Approved | RequestState::Provisioning => Some(placed(f)),
        _ => None,
    }
}

fn pending(f: &Facts) -> WaitReason {
    if let Some((resource, held, requested, limit)) = &f.over_quota {
        return WaitReason::QuotaExceeded {
            resource: resource.clone(),
            held: *held,
            requested: *requested,
            limit: *limit,
        };
    }
    match &f.room {
        Room::Unplaceable(models) => match f.reclaim_until {
            Some(until_ms) => WaitReason::WaitingForReclaim { until_ms },
            None => WaitReason::NoCapacity { models: models.clone() },
        },
        Room::Placeable if f.reserved.is_some() => {
            let (reservation, starts_at_ms) = f.reserved.clone().unwrap_or_default();
            WaitReason::Reserved { reservation, starts_at_ms }
        }
        Room::Placeable if f.not_before.is_some() => {
            let (reservation, starts_at_ms) = f.not_before.clone().unwrap_or_default();
            WaitReason::ReservationNotStarted { reservation, starts_at_ms }
        }
        Room::Placeable if f.auto_approves => WaitReason::Queued,
        Room::Placeable => WaitReason::AwaitingApproval { approvers: f.approvers.iter().take(10).cloned().collect() },
    }
}

fn placed(f: &Facts) -> WaitReason {
    if let Some((proposal, gpu)) = f.slices.iter().find_map(|s| Some((s.proposal.clone()?, s.gpu.clone()))) {
        return WaitReason::LayoutAwaitingApproval { proposal, gpu };
    }
    if let Some(s) = f.slices.iter().find(|s| s.cordoned) {
        return WaitReason::GpuCordoned { gpu: s.gpu.clone() };
    }
    if let Some(s) = f.slices.iter().find(|s| !s.node_ready) {
        return WaitReason::NodeNotReady { node: s.node.clone() };
    }
    if let Some((reservation, starts_at_ms)) = f.not_before.clone() {
        return WaitReason::ReservationNotStarted { reservation, starts_at_ms };
    }
    WaitReason::BeingApplied { node: f.slices.first().map(|s| s.node.clone()).unwrap_or_default() }
}

/// Whether a request's free compute slices would suffice on some model that the planner still cannot use:
/// `free` and `needed` per model.
pub fn fragmented(free: f64, needed: f64) -> bool {
    needed > 0.0 && free + 1e-9 >= needed
}

/// The earliest time a waiting request could start, from the known ends of the slices that hold room: `fits(k)`
/// says whether it fits once the first `k` of `ends` (ascending) are released. `None` when it fits only after
/// slices with no known end, or never. `Some(now)` when it fits now.
pub fn earliest_start(now_ms: i64, ends: &[i64], mut fits: impl FnMut(usize) -> bool) -> Option<i64> {
    if fits(0) {
        return Some(now_ms);
    }
    // Binary search over the number released: fitting only grows as more is released.
    let (mut lo, mut hi) = (1, ends.len());
    if hi == 0 || !fits(hi) {
        return None;
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fits(mid) { hi = mid } else { lo = mid + 1 }
    }
    Some(ends[lo - 1].max(now_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(state: RequestState) -> Facts {
        Facts {
            state,
            over_quota: None,
            reclaim_until: None,
            auto_approves: false,
            room: Room::Placeable,
            approvers: vec!["root".into()],
            slices: vec![],
            reserved: None,
            not_before: None,
        }
    }

    fn slice(node_ready: bool, cordoned: bool, proposal: Option<&str>) -> SliceFacts {
        SliceFacts { proposal: proposal.map(str::to_string), gpu: "g1".into(), cordoned, node: "n1".into(), node_ready }
    }

    #[test]
    fn pending_requests_wait_for_quota_then_reclaim_then_room_then_an_admin() {
        let mut f = facts(RequestState::Pending);
        assert_eq!(reason(&f), Some(WaitReason::AwaitingApproval { approvers: vec!["root".into()] }));
        f.auto_approves = true;
        assert_eq!(reason(&f), Some(WaitReason::Queued));
        let room = ModelRoom {
            model: "H100-80GB".into(),
            free_slices: 3.0,
            needed_slices: 3.0,
            fragmented: true,
            make_room: vec![],
            held_back: HeldBack::default(),
        };
        f.room = Room::Unplaceable(vec![room]);
        let r = reason(&f).expect("waits");
        assert_eq!(r.code(), "no_capacity");
        assert!(r.sentence().contains("scattered"), "{}", r.sentence());
        assert!(!r.sentence().contains("not taking new work"), "{}", r.sentence());
        let change = RoomChange {
            gpu: "g1".into(),
            index: 2,
            node: "node-a".into(),
            moves: vec![InstanceMove { request: Some("r9".into()), profile: "1g.10gb".into(), from: 4, to: 1 }],
            fits: 1,
            layout: vec![],
        };
        if let Room::Unplaceable(models) = &mut f.room {
            models[0].make_room = vec![change];
        }
        let r = reason(&f).expect("waits");
        assert!(
            r.sentence()
                .contains("moving 1 instance in use would make room (GPU 2 of node-a: 1g.10gb from unit 4 to 1)"),
            "{}",
            r.sentence()
        );
        f.reclaim_until = Some(60_000);
        assert_eq!(reason(&f).map(|r| r.code()), Some("waiting_for_reclaim"));
        f.over_quota = Some(("compute_slices".into(), 9.0, 2.0, 7.0));
        let r = reason(&f).expect("waits");
        assert_eq!(r.code(), "quota_exceeded");
        assert!(r.sentence().contains("over its limit of 7"), "{}", r.sentence());
        assert_eq!(reason(&facts(RequestState::Active)), None);
        assert_eq!(reason(&facts(RequestState::Released)), None);
    }

    #[test]
    fn approved_requests_wait_for_a_layout_then_the_gpu_then_the_node() {
        let mut f = facts(RequestState::Approved);
        f.slices = vec![slice(false, true, Some("p1"))];
        assert_eq!(reason(&f).map(|r| r.code()), Some("layout_awaiting_approval"));
        f.slices = vec![slice(false, true, None)];
        assert_eq!(reason(&f).map(|r| r.code()), Some("gpu_cordoned"));
        f.slices = vec![slice(false, false, None)];
        assert_eq!(reason(&f).map(|r| r.code()), Some("node_not_ready"));
        f.slices = vec![slice(true, false, None)];
        assert_eq!(reason(&f), Some(WaitReason::BeingApplied { node: "n1".into() }));
        f.not_before = Some(("r1".into(), 600_000));
        let r = reason(&f).expect("waits");
        assert_eq!(r, WaitReason::ReservationNotStarted { reservation: "r1".into(), starts_at_ms: 600_000 });
        assert!(r.sentence().contains("1970-01-01 00:10"), "{}", r.sentence());
    }

    #[test]
    fn room_booked_by_a_reservation_is_said_before_the_queue() {
        let mut f = facts(RequestState::Pending);
        f.auto_approves = true;
        f.reserved = Some((Some("r9".into()), 120_000));
        let r = reason(&f).expect("waits");
        assert_eq!(r.code(), "reserved");
        assert!(WaitReason::CODES.contains(&r.code()));
        assert!(r.sentence().contains("reservation r9"), "{}", r.sentence());
        f.reserved = Some((None, 120_000));
        let r = reason(&f).expect("waits");
        assert!(r.sentence().contains("booked by another tenant's reservation from"), "{}", r.sentence());
        f.reserved = None;
        assert_eq!(reason(&f), Some(WaitReason::Queued));
    }

    #[test]
    fn the_earliest_start_is_the_first_end_after_which_it_fits() {
        let ends = [100, 200, 300, 400];
        assert_eq!(earliest_start(50, &ends, |k| k >= 3), Some(300));
        assert_eq!(earliest_start(50, &ends, |_| true), Some(50));
        assert_eq!(earliest_start(50, &ends, |_| false), None);
        assert_eq!(earliest_start(50, &[], |k| k > 0), None);
        assert_eq!(earliest_start(250, &ends, |k| k >= 1), Some(250), "an end already passed counts from now");
    }

    #[test]
    fn gpus_held_back_are_counted_by_cause() {
        let held = HeldBack { cordoned: 1, node_not_ready: 0, layout_pending: 2, free_slices: 13.0 };
        assert_eq!(
            held.sentence().as_deref(),
            Some("1 GPU cordoned, 2 GPUs with a layout change waiting for approval; 13 compute slices free there")
        );
        let room = ModelRoom {
            model: "H100-80GB".into(),
            free_slices: 0.0,
            needed_slices: 1.0,
            fragmented: false,
            make_room: vec![],
            held_back: HeldBack { cordoned: 0, node_not_ready: 0, layout_pending: 1, free_slices: 6.0 },
        };
        let sentence = WaitReason::NoCapacity { models: vec![room] }.sentence();
        assert_eq!(
            sentence,
            "The fleet has no room for it now (H100-80GB: 0 compute slices free, 1 needed; not taking new work: 1 GPU \
             with a layout change waiting for approval; 6 compute slices free there)."
        );
        assert_eq!(HeldBack::default().sentence(), None);
    }
}
