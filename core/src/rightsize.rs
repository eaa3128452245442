//! Right-sizing: the smallest slice that would have carried what an allocation used, with headroom.
//!
//! An allocation's use over a window is its peak memory and the 95th percentile of its one-minute mean utilisation
//! (the share of what it holds that was busy). What it *needs* is that use plus the headroom: memory
//! `peak × (1 + headroom)`, and compute `p95 % × its compute slices × (1 + headroom)` slices. The suggestion is the
//! profile of the same model and variant, no larger than what it holds in compute or memory, with the fewest compute
//! slices and then the least memory that meets both needs. A whole GPU is judged against the model's base MIG
//! profiles. Time-sliced and MPS shares are not judged here: their device's figures are all holders' at once.

use crate::catalog::ProfileIdx;
use crate::catalog::{GpuModel, Profile};

/// Fewest minutes with telemetry in a window before an allocation is judged.
pub const MIN_MINUTES: u32 = 60;
/// The headroom unless the caller says otherwise (20 %).
pub const DEFAULT_HEADROOM: f64 = 0.2;
/// The most headroom a caller may ask for (100 %: twice what was used).
pub const MAX_HEADROOM: f64 = 1.0;

/// What an allocation used over a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// Minutes with telemetry.
    pub minutes: u32,
    /// Peak memory in use, MiB.
    pub peak_mem_mib: f64,
    /// 95th percentile of the one-minute mean utilisation, % of what the allocation holds; `None` where the GPU
    /// reports none for it ([`util_measured`]), which judges it as using all of its compute.
    pub p95_util: Option<f64>,
}

/// What an allocation holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A MIG instance of this profile.
    Instance(ProfileIdx),
    /// A whole GPU, not shared.
    WholeGpu,
}

/// The judgement on one allocation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// A smaller profile would carry its use with the headroom.
    Smaller {
        /// The suggested profile.
        profile: ProfileIdx,
        /// Compute slices it would give back.
        compute_saved: u8,
        /// Memory slices it would give back.
        memory_saved: u8,
    },
    /// Nothing smaller of its model and variant carries its use with the headroom.
    RightSized,
    /// Its use with the headroom is more than it holds, in compute or memory: it may want a larger slice.
    AtLimit,
    /// Fewer than [`MIN_MINUTES`] minutes with telemetry.
    NotEnoughData,
}

/// What an allocation needs: compute slices (fractional) and memory, MiB.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Need {
    /// Compute slices.
    pub compute: f64,
    /// Memory, MiB.
    pub memory_mib: f64,
}

/// Memory of `p` on `model`, MiB: the catalog's figure, else `nvidia-smi`'s GiB, else the profile's share of the
/// model's memory slices (of the observed total, else of the nominal GB).
pub fn profile_memory_mib(model: &GpuModel, p: &Profile) -> f64 {
    if let Some(m) = p.memory_mib {
        return f64::from(m);
    }
    if let Some(g) = p.memory_gib_lgip {
        return g * 1024.0;
    }
    f64::from(p.memory_slices) * whole_memory_mib(model) / f64::from(model.memory_slices_total.max(1))
}

/// Memory of a whole GPU of `model`, MiB: observed, else the nominal GB (10^9 bytes) in MiB.
pub fn whole_memory_mib(model: &GpuModel) -> f64 {
    match model.total_memory_mib_observed {
        Some(m) => f64::from(m),
        None => f64::from(model.total_memory_gb_nominal) * 1e9 / 1_048_576.0,
    }
}

/// Compute slices and memory (MiB) and memory slices of what is held.
fn held_size(model: &GpuModel, held: Held) -> Option<(u8, f64, u8)> {
    match held {
        Held::Instance(p) => {
            let p = model.profiles.get(p)?;
            Some((p.compute_slices, profile_memory_mib(model, p), p.memory_slices))
        }
        Held::WholeGpu => Some((model.compute_slices_total, whole_memory_mib(model), model.memory_slices_total)),
    }
}

/// What `usage` needs on `model` with `headroom` (a fraction, clamped to 0..=[`MAX_HEADROOM`]) when it ran on
/// `held`. `None` when `held` names no profile of `model`.
pub fn need(model: &GpuModel, held: Held, usage: &Usage, headroom: f64) -> Option<Need> {
    let (compute, _, _) = held_size(model, held)?;
    let h = 1.0 + headroom.clamp(0.0, MAX_HEADROOM);
    let compute = match usage.p95_util {
        Some(u) => u.clamp(0.0, 100.0) / 100.0 * f64::from(compute) * h,
        None => f64::from(compute),
    };
    Some(Need { compute, memory_mib: usage.peak_mem_mib.max(0.0) * h })
}

/// The judgement on an allocation holding `held` on `model` that used `usage`, with `headroom` ([`need`]).
/// `None` when `held` names no profile of `model`.
pub fn judge(model: &GpuModel, held: Held, usage: &Usage, headroom: f64) -> Option<Verdict> {
    let (compute, memory, memory_slices) = held_size(model, held)?;
    if usage.minutes < MIN_MINUTES {
        return Some(Verdict::NotEnoughData);
    }
    let n = need(model, held, usage, headroom)?;
    // A whole slice is the least anything takes; a hair over a whole number (float noise) does not round up.
    let compute_needed = (n.compute - 1e-9).ceil().max(1.0);
    if compute_needed > f64::from(compute) || n.memory_mib > memory {
        return Some(Verdict::AtLimit);
    }
    let variant = match held {
        Held::Instance(p) => model.profiles[p].variant.as_str(),
        Held::WholeGpu => "base",
    };
    let best = model
        .profiles
        .iter()
        .enumerate()
        .filter(|(_, p)| p.variant == variant)
        .map(|(i, p)| (i, p, profile_memory_mib(model, p)))
        .filter(|(_, p, m)| {
            f64::from(p.compute_slices) >= compute_needed
                && *m >= n.memory_mib
                && p.compute_slices <= compute
                && *m <= memory
        })
        .min_by(|a, b| a.1.compute_slices.cmp(&b.1.compute_slices).then(a.2.total_cmp(&b.2)).then(a.0.cmp(&b.0)));
    // Smaller means fewer compute or memory slices (a 7g on a whole GPU holds all of both: not smaller).
    Some(match best {
        Some((i, p, _)) if p.compute_slices < compute || p.memory_slices < memory_slices => Verdict::Smaller {
            profile: i,
            compute_saved: compute - p.compute_slices,
            memory_saved: memory_slices.saturating_sub(p.memory_slices),
        },
        _ => Verdict::RightSized,
    })
}

/// Whether NVML reports utilisation for a MIG instance of `model`: through GPM, which Ampere GPUs (A100, A30) lack
/// (their agent reports 0). A whole GPU's utilisation is always measured.
pub fn util_measured(model: &GpuModel, held: Held) -> bool {
    matches!(held, Held::WholeGpu) || !model.architecture.starts_with("Ampere")
}

/// Whether `to` (a profile of `model`) is smaller than `held`: of the same variant (a whole GPU: base), with no more
/// compute or memory slices, and fewer of one of them. What "request the smaller slice" accepts.
pub fn is_smaller(model: &GpuModel, held: Held, to: ProfileIdx) -> bool {
    let Some((compute, _, memory_slices)) = held_size(model, held) else { return false };
    let Some(p) = model.profiles.get(to) else { return false };
    let variant = match held {
        Held::Instance(h) => model.profiles[h].variant.as_str(),
        Held::WholeGpu => "base",
    };
    p.variant == variant
        && p.compute_slices <= compute
        && p.memory_slices <= memory_slices
        && (p.compute_slices < compute || p.memory_slices < memory_slices)
}

/// The `q` quantile (0..=1) of a histogram of percents rounded to whole numbers (`counts[b]`: minutes whose value
/// rounded to `b`), given as the bucket's upper edge `b + 0.5` (at most 100) so that it never understates. `None`
/// for an empty histogram.
pub fn quantile_upper(counts: &[u64; 101], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    // The smallest bucket at which at least q of the minutes are counted.
    let want = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (b, c) in counts.iter().enumerate() {
        seen += c;
        if seen >= want {
            return Some((b as f64 + 0.5).min(100.0));
        }
    }
    Some(100.0)
}

/// The bucket of [`quantile_upper`]'s histogram for a utilisation in percent (clamped to 0..=100), as the store
/// rounds it.
pub fn bucket(util: f64) -> usize {
    if util.is_nan() { 0 } else { util.clamp(0.0, 100.0).round() as usize }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;

    fn h100() -> GpuModel {
        Catalog::builtin().model("H100-80GB").expect("known").clone()
    }

    fn usage(peak_gib: f64, p95: f64) -> Usage {
        Usage { minutes: 600, peak_mem_mib: peak_gib * 1024.0, p95_util: Some(p95) }
    }

    fn name(m: &GpuModel, v: Verdict) -> String {
        match v {
            Verdict::Smaller { profile, compute_saved, memory_saved } => {
                format!("{} -{compute_saved}c -{memory_saved}m", m.profiles[profile].name)
            }
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn a_3g_that_peaked_at_6_gib_and_12_percent_fits_a_1g_10gb() {
        let m = h100();
        let held = Held::Instance(m.profile_index("3g.40gb").expect("known"));
        let v = judge(&m, held, &usage(6.0, 12.0), 0.2).expect("known");
        assert_eq!(name(&m, v), "1g.10gb -2c -3m");
        // 15 GiB needs 18 GiB with the headroom: more than a 1g.10gb, within a 1g.20gb.
        assert_eq!(name(&m, judge(&m, held, &usage(15.0, 12.0), 0.2).expect("known")), "1g.20gb -2c -2m");
        // 30 GiB (36 GiB with headroom) leaves only the 3g.40gb itself: the 4g.40gb has more compute.
        assert_eq!(judge(&m, held, &usage(30.0, 12.0), 0.2).expect("known"), Verdict::RightSized);
        // 40% of 3 slices is 1.2, 1.44 with headroom: two slices, and 2g.20gb's memory carries 10 GiB.
        assert_eq!(name(&m, judge(&m, held, &usage(10.0, 40.0), 0.2).expect("known")), "2g.20gb -1c -2m");
    }

    #[test]
    fn use_at_or_over_what_is_held_is_at_limit_and_headroom_counts() {
        let m = h100();
        let held = Held::Instance(m.profile_index("3g.40gb").expect("known"));
        // 95% of 3 slices is 2.85, 3.42 with headroom: more than it holds.
        assert_eq!(judge(&m, held, &usage(6.0, 95.0), 0.2).expect("known"), Verdict::AtLimit);
        // Without headroom 2.85 rounds up to its 3 slices: right-sized, not at the limit.
        assert_eq!(judge(&m, held, &usage(6.0, 95.0), 0.0).expect("known"), Verdict::RightSized);
        // 36 GiB with 20% is 43.2 GiB, over the 3g.40gb's 39.5 GiB.
        assert_eq!(judge(&m, held, &usage(36.0, 10.0), 0.2).expect("known"), Verdict::AtLimit);
        // Exactly one slice's worth (1/3 of 3 slices, no headroom) stays one slice.
        let third = Usage { minutes: 60, peak_mem_mib: 1024.0, p95_util: Some(100.0 / 3.0) };
        assert_eq!(name(&m, judge(&m, held, &third, 0.0).expect("known")), "1g.10gb -2c -3m");
    }

    #[test]
    fn too_few_minutes_is_not_judged_and_variants_stay_their_own() {
        let m = h100();
        let held = Held::Instance(m.profile_index("3g.40gb").expect("known"));
        let short = Usage { minutes: MIN_MINUTES - 1, ..usage(1.0, 1.0) };
        assert_eq!(judge(&m, held, &short, 0.2).expect("known"), Verdict::NotEnoughData);
        // A +me instance is only ever offered a +me instance (the media engines may be why it was asked for).
        let me = Held::Instance(m.profile_index("1g.10gb+me").expect("known"));
        assert_eq!(judge(&m, me, &usage(1.0, 1.0), 0.2).expect("known"), Verdict::RightSized);
        // 1g.20gb at 4 GiB: same compute, half the memory.
        let big_mem = Held::Instance(m.profile_index("1g.20gb").expect("known"));
        assert_eq!(name(&m, judge(&m, big_mem, &usage(4.0, 50.0), 0.2).expect("known")), "1g.10gb -0c -1m");
        assert!(judge(&m, Held::Instance(99), &usage(1.0, 1.0), 0.2).is_none());
    }

    #[test]
    fn a_whole_gpu_is_judged_against_the_base_profiles() {
        let m = h100();
        // 10% of 7 slices is 0.7, 0.84 with headroom: one slice; 5 GiB fits a 1g.10gb.
        assert_eq!(name(&m, judge(&m, Held::WholeGpu, &usage(5.0, 10.0), 0.2).expect("known")), "1g.10gb -6c -7m");
        // 50%: 3.5 → 4.2 slices → 7g.
        assert_eq!(judge(&m, Held::WholeGpu, &usage(5.0, 50.0), 0.2).expect("known"), Verdict::RightSized);
        // 45% with 20%: 3.78 slices → 4g.40gb.
        assert_eq!(name(&m, judge(&m, Held::WholeGpu, &usage(20.0, 45.0), 0.2).expect("known")), "4g.40gb -3c -4m");
    }

    #[test]
    fn smaller_means_no_more_of_either_and_less_of_one_in_the_same_variant() {
        let m = h100();
        let p = |n: &str| m.profile_index(n).expect("known");
        let three = Held::Instance(p("3g.40gb"));
        assert!(is_smaller(&m, three, p("1g.10gb")));
        assert!(is_smaller(&m, three, p("2g.20gb")));
        assert!(!is_smaller(&m, three, p("3g.40gb")), "the same is not smaller");
        assert!(!is_smaller(&m, three, p("4g.40gb")), "more compute");
        assert!(!is_smaller(&m, three, p("1g.10gb+me")), "another variant");
        assert!(!is_smaller(&m, Held::Instance(p("1g.20gb")), p("2g.20gb")), "more compute, same memory");
        assert!(is_smaller(&m, Held::Instance(p("1g.20gb")), p("1g.10gb")));
        assert!(is_smaller(&m, Held::WholeGpu, p("4g.40gb")));
        assert!(!is_smaller(&m, Held::WholeGpu, p("7g.80gb")), "all of both");
        assert!(!is_smaller(&m, three, 99));
    }

    #[test]
    fn without_instance_utilisation_only_memory_is_judged() {
        let a100 = Catalog::builtin().model("A100-80GB").expect("known").clone();
        let held = Held::Instance(a100.profile_index("3g.40gb").expect("known"));
        assert!(!util_measured(&a100, held));
        assert!(util_measured(&a100, Held::WholeGpu));
        assert!(util_measured(&h100(), Held::Instance(0)));
        let memory_only = Usage { minutes: 600, peak_mem_mib: 6.0 * 1024.0, p95_util: None };
        // All three slices are taken as busy: nothing with less compute, and 3g.40gb is the only 3g.
        assert_eq!(judge(&a100, held, &memory_only, 0.2).expect("known"), Verdict::RightSized);
        let held_1g = Held::Instance(a100.profile_index("2g.20gb").expect("known"));
        assert_eq!(judge(&a100, held_1g, &memory_only, 0.2).expect("known"), Verdict::RightSized);
    }

    #[test]
    fn the_upper_quantile_never_understates() {
        let mut h = [0u64; 101];
        assert_eq!(quantile_upper(&h, 0.95), None);
        // 95 minutes at 12.3% and 5 at 80%: the 95th percentile is in the 12% bucket, reported as 12.5.
        h[bucket(12.3)] += 95;
        h[bucket(80.0)] += 5;
        assert_eq!(quantile_upper(&h, 0.95), Some(12.5));
        // One more minute high and the 95th percentile is the high bucket.
        h[bucket(80.0)] += 1;
        assert_eq!(quantile_upper(&h, 0.95), Some(80.5));
        let mut full = [0u64; 101];
        full[bucket(100.0)] = 3;
        full[bucket(f64::NAN)] = 0;
        assert_eq!(quantile_upper(&full, 0.95), Some(100.0));
        assert_eq!(bucket(-5.0), 0);
        assert_eq!(bucket(250.0), 100);
    }
}
