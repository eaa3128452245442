//! How many slices fit: the search that counts them with as few probes as it can, and the limit a preview counts
//! to. Each probe is a question to the calendar engine; the search itself knows only the answers.

use super::rules::Shortfall;

/// How many slices a preview counts up to when fewer are asked for (see [`Prepared::preview`]).
///
/// [`Prepared::preview`]: super::calendar::Prepared::preview
pub const PREVIEW_COUNT: u32 = 64;

/// The most a preview of `asked` slices counts to: `asked` or [`PREVIEW_COUNT`], whichever is larger.
pub fn preview_limit(asked: u32) -> u32 {
    asked.max(PREVIEW_COUNT)
}

/// The most slices that fit, up to `bound`, found with `probe(n)` (whether `n` slices fit; the shortfalls else), for
/// a booking `id`. It probes `asked` first (a preview needs that answer anyway; 0 skips it), then gallops down from
/// the highest count still possible: it probes that count, then ever further below it (2, 6, 14, ... slices) until
/// a count fits, and searches between the two by halves. At most about twice the probes of halving (when the answer
/// is far below the bound), one or two when it is at the bound. When a probe finds the booking itself short of room at its
/// start, no count above what it placed there is probed. The answer is usually near the bound (the room at the
/// window's start), where the first probe or two find it; a plain binary search from 0 probes about ten times.
/// Fitting is taken to be monotone in the count, which the heuristic planner does not promise: the answer always
/// fits, and on rare fleets a larger count the search passed over could fit too.
pub fn search_most(asked: u32, bound: u32, id: &str, mut probe: impl FnMut(u32) -> Result<(), Vec<Shortfall>>) -> u32 {
    let bound = bound.min(1000);
    // What is known: `lo` fits, nothing above `hi` does.
    let (mut lo, mut hi) = (0u32, bound);
    let fail = |n: u32, short: &[Shortfall], lo: u32, hi: &mut u32| {
        *hi = n - 1;
        if let Some(s) = short.iter().find(|s| s.booking == id && s.placed < n) {
            *hi = (*hi).min(s.placed).max(lo);
        }
    };
    if asked > 0 && asked <= bound {
        match probe(asked) {
            Ok(()) => lo = asked,
            Err(short) => fail(asked, &short, lo, &mut hi),
        }
    }
    // Gallop: probe `hi`, then 2, 6, 14, ... below where it started (each step twice the last), or exactly the new
    // `hi` when a probe's own shortfall lowered it further, until a count fits.
    let mut step = 1u32;
    while lo < hi {
        let n = (hi + 1).saturating_sub(step).max(lo + 1);
        match probe(n) {
            Ok(()) => {
                lo = n;
                break;
            }
            Err(short) => {
                fail(n, &short, lo, &mut hi);
                step = if hi + 1 < n { 1 } else { step.saturating_mul(2) };
            }
        }
    }
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        match probe(mid) {
            Ok(()) => lo = mid,
            Err(short) => fail(mid, &short, lo, &mut hi),
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_finds_the_most_that_fit_of_any_monotone_probe() {
        // Every answer 0..=40 under every bound, with and without an asked count, and with the booking's own
        // shortfall saying how many found room at its start (as a replay does) or not.
        for bound in 0..=40u32 {
            for answer in 0..=bound {
                for asked in [0, 1, answer, answer + 1, bound] {
                    for own in [false, true] {
                        let mut probes = 0;
                        let found = search_most(asked, bound, "x", |n| {
                            probes += 1;
                            assert!((1..=bound).contains(&n), "probe {n} outside 1..={bound}");
                            if n <= answer {
                                return Ok(());
                            }
                            let placed = if own { answer } else { n - 1 };
                            let short = Shortfall { booking: "x".into(), start_ms: 0, wanted: n, placed };
                            Err(if own { vec![short] } else { vec![Shortfall { booking: "y".into(), ..short }] })
                        });
                        assert_eq!(found, answer, "bound {bound}, asked {asked}, own {own}");
                        assert!(probes <= 2 * (u32::BITS - bound.leading_zeros()) + 2, "{probes} probes");
                    }
                }
            }
        }
    }
}
