//! GPU health: what an agent reads from the driver about each GPU ([`GpuHealthReport`]: XID errors, ECC counts,
//! retired pages, row remapping, throttle reasons, temperature) and the rule that judges it ([`judge`]): `healthy`,
//! `degraded` (it still serves; admins should look) or `unhealthy` (nothing new may run there).
//!
//! The rule follows NVIDIA's XID catalogue and its row-remapping guidance:
//! - **Unhealthy:** a fatal XID ([`FATAL_XIDS`]: 48 double-bit ECC error, 61 and 62 internal micro-controller
//!   halt, 64 ECC page retirement or row remapping failure, 74 NVLink error, 79 fallen off the bus, 92 high
//!   single-bit ECC rate, 95 uncontained ECC error, 119 and 120 GSP error, 140 unrecovered ECC error); a row remap
//!   pending (the GPU needs a reset before the remap takes effect) or a remapping failure; pages pending
//!   retirement (GPUs before Ampere).
//! - **Degraded:** XID 63 (a row remap or page retirement was recorded) and 94 (a contained ECC error: the
//!   application was stopped, the GPU serves on); uncorrected volatile ECC errors since the last reset; hardware
//!   slowdown, hardware thermal slowdown or power-brake throttling; a temperature within 5 °C of the slowdown
//!   threshold (or 87 °C when the driver gives none); 60 or more retired pages (the limit is 64). A degraded GPU
//!   stays so for at least [`DEGRADED_MIN_MS`] ([`next_state`]), so a signal at its threshold does not flap.
//!
//! XIDs are events: a report carries the latest ones ([`MAX_XIDS`]) with when they were seen. A fatal XID counts only
//! when it is newer than the last one judged (`xids_after_ms`), so a GPU returned to service is not judged again on an
//! old error; a degrading XID counts for [`DEGRADED_XID_HOLD_MS`] after it was seen, so the state does not flap back
//! at the next report.

use serde::{Deserialize, Serialize};

/// Longest a drain may give holders before their slices end: 7 days.
pub const MAX_DRAIN_S: u32 = 7 * 24 * 3600;
/// A drain's deadline when none is given: 1 hour.
pub const DEFAULT_DRAIN_S: u32 = 3600;

/// XIDs that make a GPU unhealthy.
pub const FATAL_XIDS: &[u32] = &[48, 61, 62, 64, 74, 79, 92, 95, 119, 120, 140];
/// XIDs that make a GPU degraded.
pub const DEGRADING_XIDS: &[u32] = &[63, 94];
/// How long a degrading XID keeps a GPU degraded: 24 hours.
pub const DEGRADED_XID_HOLD_MS: i64 = 24 * 3_600_000;
/// How far ahead of the server's clock a node's XID time may be: 5 minutes.
pub const MAX_CLOCK_AHEAD_MS: i64 = 5 * 60_000;
/// How long a GPU stays degraded at least once it is, so a signal at its threshold does not flap the state (and
/// its events) on every report: 10 minutes.
pub const DEGRADED_MIN_MS: i64 = 10 * 60_000;
/// Most XIDs a report carries (the latest).
pub const MAX_XIDS: usize = 16;
/// Most throttle reasons a report carries.
pub const MAX_THROTTLE: usize = 16;
/// Longest throttle reason name.
pub const MAX_REASON_LEN: usize = 40;
/// Degraded this close to the slowdown temperature, °C.
pub const SLOWDOWN_MARGIN_C: u32 = 5;
/// Degraded from this temperature when the driver gives no slowdown threshold, °C.
pub const HOT_C: u32 = 87;
/// Degraded from this many retired pages (a GPU retires at most 64).
pub const RETIRED_PAGES_DEGRADED: u32 = 60;
/// Throttle reasons that mean the hardware protects itself.
pub const DEGRADING_THROTTLE: &[&str] = &["hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"];

/// One XID error the driver reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Xid {
    /// The XID.
    pub code: u32,
    /// When the agent saw it, ms since the epoch.
    pub at_ms: i64,
}

/// Row remapping (Ampere and later).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub correctable: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrectable: u32,
    /// A remap waits for a GPU reset.
    pub pending: bool,
    /// A remap failed.
    pub failure: bool,
}

/// What the driver says of a GPU's health; each field absent when the GPU or driver does not tell it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuHealthReport {
    /// The latest XID errors, oldest first (at most [`MAX_XIDS`]).
    #[serde(default)]
    pub xids: Vec<Xid>,
    /// Uncorrected ECC errors since the last reset.
    #[serde(default)]
    pub ecc_uncorrected_volatile: Option<u64>,
    /// Uncorrected ECC errors over the GPU's life.
    #[serde(default)]
    pub ecc_uncorrected_aggregate: Option<u64>,
    /// Corrected ECC errors since the last reset.
    #[serde(default)]
    pub ecc_corrected_volatile: Option<u64>,
    /// Retired pages (single- and double-bit causes together; GPUs before Ampere).
    #[serde(default)]
    pub retired_pages: Option<u32>,
    /// Pages waiting to be retired at the next reset (GPUs before Ampere).
    #[serde(default)]
    pub retired_pages_pending: Option<bool>,
    /// Row remapping (Ampere and later).
    #[serde(default)]
    pub remapped_rows: Option<RemappedRows>,
    /// Active clock throttle reasons, e.g. `hw_slowdown`, `sw_power_cap`, `gpu_idle`.
    #[serde(default)]
    pub throttle: Vec<String>,
    /// Core temperature, °C.
    #[serde(default)]
    pub temperature_c: Option<u32>,
    /// Temperature at which the hardware slows the clocks, °C.
    #[serde(default)]
    pub slowdown_temperature_c: Option<u32>,
}

/// A GPU's health.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Nothing wrong.
    #[default]
    Healthy,
    /// Serves, with something an admin should look at.
    Degraded,
    /// Cordoned: nothing new runs there until an admin returns it to service.
    Unhealthy,
}

impl HealthState {
    /// `healthy`, `degraded` or `unhealthy`.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Degraded => "degraded",
            HealthState::Unhealthy => "unhealthy",
        }
    }

    /// The state named `s`.
    pub fn parse(s: &str) -> Option<HealthState> {
        match s {
            "healthy" => Some(HealthState::Healthy),
            "degraded" => Some(HealthState::Degraded),
            "unhealthy" => Some(HealthState::Unhealthy),
            _ => None,
        }
    }
}

/// One reason for a judgement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Finding {
    /// Stable code: `xid_48`, `row_remap_pending`, `row_remap_failure`, `pages_pending_retirement`,
    /// `ecc_uncorrected`, `throttle_hw_slowdown`, `hot`, `retired_pages`.
    pub code: String,
    /// The state it leads to.
    pub state: HealthState,
    /// What it means, for people.
    pub message: String,
}

/// What is wrong with a report, when it cannot be taken (it comes from a node, a less-trusted party).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadReport(pub String);

impl GpuHealthReport {
    /// Checks the bounds of a report from a node at `now_ms`: at most [`MAX_XIDS`] XIDs, each seen between the epoch
    /// and [`MAX_CLOCK_AHEAD_MS`] after `now_ms` (an XID from the future would hide every later one: the judged
    /// watermark only moves forward), and [`MAX_THROTTLE`] throttle reasons of at most [`MAX_REASON_LEN`] bytes in
    /// `a-z`, `0-9` and `_`.
    pub fn check(&self, now_ms: i64) -> Result<(), BadReport> {
        if self.xids.len() > MAX_XIDS {
            return Err(BadReport(format!("at most {MAX_XIDS} XIDs a report")));
        }
        if let Some(x) = self.xids.iter().find(|x| x.at_ms < 0 || x.at_ms > now_ms.saturating_add(MAX_CLOCK_AHEAD_MS)) {
            return Err(BadReport(format!(
                "XID {} seen at {} ms: XIDs are seen between the epoch and 5 minutes from now (is the node's clock right?)",
                x.code, x.at_ms
            )));
        }
        if self.throttle.len() > MAX_THROTTLE {
            return Err(BadReport(format!("at most {MAX_THROTTLE} throttle reasons a report")));
        }
        if let Some(r) = self.throttle.iter().find(|r| {
            r.is_empty()
                || r.len() > MAX_REASON_LEN
                || !r.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        }) {
            return Err(BadReport(format!(
                "throttle reason `{}` is not 1 to {MAX_REASON_LEN} of a-z, 0-9 and _",
                r.escape_default()
            )));
        }
        Ok(())
    }

    /// The newest XID's time, if any.
    pub fn latest_xid_ms(&self) -> Option<i64> {
        self.xids.iter().map(|x| x.at_ms).max()
    }
}

/// What an XID means, in words (for the codes the rule knows).
pub fn xid_meaning(code: u32) -> &'static str {
    match code {
        48 => "double-bit ECC error",
        61 => "internal micro-controller breakpoint or warning",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failed",
        74 => "NVLink error",
        79 => "the GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error (the application was stopped)",
        95 => "uncontained ECC error",
        119 | 120 => "GSP error",
        140 => "unrecovered ECC error",
        _ => "driver error",
    }
}

/// Judges a report at `now_ms`: the worst state its findings lead to, and the findings, worst first. Fatal XIDs at
/// or before `xids_after_ms` were judged before and do not count; degrading XIDs count for
/// [`DEGRADED_XID_HOLD_MS`].
pub fn judge(report: &GpuHealthReport, xids_after_ms: i64, now_ms: i64) -> (HealthState, Vec<Finding>) {
    let mut findings = Vec::new();
    let mut add = |code: String, state: HealthState, message: String| {
        if !findings.iter().any(|f: &Finding| f.code == code) {
            findings.push(Finding { code, state, message });
        }
    };
    for x in &report.xids {
        let state = if FATAL_XIDS.contains(&x.code) && x.at_ms > xids_after_ms {
            HealthState::Unhealthy
        } else if DEGRADING_XIDS.contains(&x.code) && x.at_ms > now_ms - DEGRADED_XID_HOLD_MS {
            HealthState::Degraded
        } else {
            continue;
        };
        add(format!("xid_{}", x.code), state, format!("XID {}: {}", x.code, xid_meaning(x.code)));
    }
    if let Some(r) = report.remapped_rows {
        if r.pending {
            add("row_remap_pending".into(), HealthState::Unhealthy, "a row remap waits for a GPU reset".into());
        }
        if r.failure {
            add("row_remap_failure".into(), HealthState::Unhealthy, "a row remap failed".into());
        }
    }
    if report.retired_pages_pending == Some(true) {
        add(
            "pages_pending_retirement".into(),
            HealthState::Unhealthy,
            "pages wait to be retired at a GPU reset".into(),
        );
    }
    if let Some(n) = report.ecc_uncorrected_volatile.filter(|&n| n > 0) {
        add(
            "ecc_uncorrected".into(),
            HealthState::Degraded,
            format!("{n} uncorrected ECC errors since the last reset"),
        );
    }
    for reason in report.throttle.iter().filter(|r| DEGRADING_THROTTLE.contains(&r.as_str())) {
        add(
            format!("throttle_{reason}"),
            HealthState::Degraded,
            format!("clocks throttled: {}", reason.replace('_', " ")),
        );
    }
    if let Some(t) = report.temperature_c {
        let limit = report.slowdown_temperature_c.map_or(HOT_C, |s| s.saturating_sub(SLOWDOWN_MARGIN_C));
        if t >= limit {
            add("hot".into(), HealthState::Degraded, format!("{t} °C, slowdown from {}", limit + SLOWDOWN_MARGIN_C));
        }
    }
    if let Some(n) = report.retired_pages.filter(|&n| n >= RETIRED_PAGES_DEGRADED) {
        add("retired_pages".into(), HealthState::Degraded, format!("{n} pages retired (at most 64)"));
    }
    findings.sort_by_key(|f| std::cmp::Reverse(f.state));
    let state = findings.first().map_or(HealthState::Healthy, |f| f.state);
    (state, findings)
}

/// The state a GPU moves to from `held` (since `held_since_ms`, `None`: since it joined) at `now_ms`: an unhealthy
/// GPU stays so until an admin returns it to service, whatever later reports say; a degraded one stays degraded for
/// at least [`DEGRADED_MIN_MS`]; otherwise the judged state.
pub fn next_state(held: HealthState, held_since_ms: Option<i64>, judged: HealthState, now_ms: i64) -> HealthState {
    match held {
        HealthState::Unhealthy => HealthState::Unhealthy,
        HealthState::Degraded
            if judged == HealthState::Healthy && held_since_ms.is_some_and(|s| now_ms - s < DEGRADED_MIN_MS) =>
        {
            HealthState::Degraded
        }
        _ => judged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 10_000;

    fn xid(code: u32, at_ms: i64) -> Xid {
        Xid { code, at_ms }
    }

    #[test]
    fn a_quiet_gpu_is_healthy() {
        let r = GpuHealthReport {
            ecc_uncorrected_volatile: Some(0),
            ecc_corrected_volatile: Some(12),
            remapped_rows: Some(RemappedRows { correctable: 1, ..Default::default() }),
            throttle: vec!["gpu_idle".into(), "sw_power_cap".into()],
            temperature_c: Some(40),
            slowdown_temperature_c: Some(90),
            ..Default::default()
        };
        assert_eq!(judge(&r, 0, NOW), (HealthState::Healthy, vec![]));
        assert_eq!(r.check(NOW), Ok(()));
    }

    #[test]
    fn fatal_xids_and_pending_remaps_make_a_gpu_unhealthy() {
        for code in FATAL_XIDS {
            let r = GpuHealthReport { xids: vec![xid(*code, 5)], ..Default::default() };
            let (state, findings) = judge(&r, 0, NOW);
            assert_eq!(state, HealthState::Unhealthy, "XID {code}");
            assert_eq!(findings[0].code, format!("xid_{code}"));
        }
        let pending = GpuHealthReport {
            remapped_rows: Some(RemappedRows { uncorrectable: 1, pending: true, ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(judge(&pending, 0, NOW).0, HealthState::Unhealthy);
        let failed = GpuHealthReport {
            remapped_rows: Some(RemappedRows { failure: true, ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(judge(&failed, 0, NOW).1[0].code, "row_remap_failure");
        let retire = GpuHealthReport { retired_pages_pending: Some(true), ..Default::default() };
        assert_eq!(judge(&retire, 0, NOW).0, HealthState::Unhealthy);
    }

    #[test]
    fn application_xids_say_nothing_of_the_gpu() {
        // 13 (graphics engine exception), 31 (memory page fault) and 43 (a kernel stopped) are the program's.
        let r = GpuHealthReport { xids: vec![xid(13, 5), xid(31, 6), xid(43, 7)], ..Default::default() };
        assert_eq!(judge(&r, 0, NOW).0, HealthState::Healthy);
    }

    #[test]
    fn old_xids_are_not_judged_again() {
        let r = GpuHealthReport { xids: vec![xid(79, 1_000), xid(94, 2_000)], ..Default::default() };
        assert_eq!(judge(&r, 0, NOW).0, HealthState::Unhealthy);
        let (state, findings) = judge(&r, 1_000, NOW);
        assert_eq!((state, findings[0].code.as_str()), (HealthState::Degraded, "xid_94"));
        // A degrading XID holds for a day, judged or not; then it is forgotten.
        assert_eq!(judge(&r, 2_000, NOW).0, HealthState::Degraded);
        assert_eq!(judge(&r, 2_000, 2_000 + DEGRADED_XID_HOLD_MS).0, HealthState::Healthy);
        assert_eq!(r.latest_xid_ms(), Some(2_000));
    }

    #[test]
    fn the_worst_finding_decides_and_comes_first() {
        let r = GpuHealthReport {
            xids: vec![xid(94, 5), xid(48, 6), xid(48, 7)],
            throttle: vec!["hw_thermal_slowdown".into()],
            temperature_c: Some(86),
            slowdown_temperature_c: Some(90),
            ecc_uncorrected_volatile: Some(2),
            retired_pages: Some(61),
            ..Default::default()
        };
        let (state, findings) = judge(&r, 0, NOW);
        assert_eq!(state, HealthState::Unhealthy);
        let codes: Vec<&str> = findings.iter().map(|f| f.code.as_str()).collect();
        assert_eq!(
            codes,
            ["xid_48", "xid_94", "ecc_uncorrected", "throttle_hw_thermal_slowdown", "hot", "retired_pages"]
        );
        // Without a threshold, 87 °C is hot; 86 is not.
        let warm = GpuHealthReport { temperature_c: Some(86), ..Default::default() };
        assert_eq!(judge(&warm, 0, NOW).0, HealthState::Healthy);
        let hot = GpuHealthReport { temperature_c: Some(87), ..Default::default() };
        assert_eq!(judge(&hot, 0, NOW).0, HealthState::Degraded);
    }

    #[test]
    fn unhealthy_holds_until_returned_to_service() {
        assert_eq!(next_state(HealthState::Unhealthy, Some(0), HealthState::Healthy, NOW), HealthState::Unhealthy);
        assert_eq!(next_state(HealthState::Healthy, None, HealthState::Unhealthy, NOW), HealthState::Unhealthy);
        // Degraded holds for 10 minutes however the reports go, then follows them; it may always get worse.
        let since = NOW - DEGRADED_MIN_MS + 1;
        assert_eq!(next_state(HealthState::Degraded, Some(since), HealthState::Healthy, NOW), HealthState::Degraded);
        assert_eq!(next_state(HealthState::Degraded, Some(since - 1), HealthState::Healthy, NOW), HealthState::Healthy);
        assert_eq!(next_state(HealthState::Degraded, Some(since), HealthState::Unhealthy, NOW), HealthState::Unhealthy);
    }

    #[test]
    fn reports_past_their_bounds_are_refused() {
        let many = GpuHealthReport { xids: (0..=MAX_XIDS as i64).map(|i| xid(13, i)).collect(), ..Default::default() };
        assert!(many.check(NOW).is_err());
        let long = GpuHealthReport { throttle: vec!["a".repeat(MAX_REASON_LEN + 1)], ..Default::default() };
        assert!(long.check(NOW).is_err());
        let odd = GpuHealthReport { throttle: vec!["hw slowdown\n".into()], ..Default::default() };
        assert!(odd.check(NOW).is_err());
        let reasons = GpuHealthReport { throttle: vec!["x".into(); MAX_THROTTLE + 1], ..Default::default() };
        assert!(reasons.check(NOW).is_err());
        // XIDs from the future (a wrong clock, or a node hiding later faults) and before the epoch.
        let ahead = GpuHealthReport { xids: vec![xid(79, NOW + MAX_CLOCK_AHEAD_MS + 1)], ..Default::default() };
        assert!(ahead.check(NOW).is_err());
        let soon = GpuHealthReport { xids: vec![xid(79, NOW + MAX_CLOCK_AHEAD_MS)], ..Default::default() };
        assert_eq!(soon.check(NOW), Ok(()));
        let negative = GpuHealthReport { xids: vec![xid(79, -1)], ..Default::default() };
        assert!(negative.check(NOW).is_err());
    }
}
