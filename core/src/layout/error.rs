//! Layout validation errors, written for the people who read them in the portal and the CLI.

use serde::Serialize;

/// An instance as the user wrote it, for messages: its position in the input (0-based) and `profile@start`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceRef {
    /// Position in the input list (0-based).
    pub index: usize,
    /// Profile name.
    pub profile: String,
    /// Start unit.
    pub start: u8,
}

impl std::fmt::Display for InstanceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "instance {} ({}@{})", self.index + 1, self.profile, self.start)
    }
}

/// One problem with a MIG layout. Validation reports every problem it finds, not only the first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The profile does not exist on this GPU model.
    #[error("instance {}: {profile} is not a MIG profile of {model}; its profiles are {}", .index + 1, known.join(", "))]
    UnknownProfile {
        /// Position in the input (0-based).
        index: usize,
        /// The name given.
        profile: String,
        /// The GPU model.
        model: String,
        /// The model's profiles.
        known: Vec<String>,
    },
    /// The start unit is not one of the profile's allowed placements.
    #[error("instance {}: {profile} cannot start at unit {start} on {model}; allowed starts are {}", .index + 1, join_units(allowed))]
    PlacementNotAllowed {
        /// Position in the input (0-based).
        index: usize,
        /// Profile name.
        profile: String,
        /// The start given.
        start: u8,
        /// The GPU model.
        model: String,
        /// The starts the driver accepts for this profile.
        allowed: Vec<u8>,
    },
    /// Two instances cover the same placement units.
    #[error("{a} overlaps {b} on {}", units_phrase(units))]
    Overlap {
        /// The earlier instance in the input.
        a: InstanceRef,
        /// The later instance in the input.
        b: InstanceRef,
        /// The units both cover.
        units: Vec<u8>,
    },
    /// More instances of a profile than one GPU can hold.
    #[error("{count} instances of {profile}, but {model} holds at most {max}")]
    TooManyInstances {
        /// Profile name.
        profile: String,
        /// The GPU model.
        model: String,
        /// Instances in the layout.
        count: usize,
        /// The profile's maximum per GPU.
        max: u8,
    },
    /// The instances need more compute slices than the GPU has.
    #[error("the instances need {used} compute slices, but {model} has {total}")]
    ComputeSlicesExceeded {
        /// The GPU model.
        model: String,
        /// Compute slices the layout needs.
        used: u32,
        /// Compute slices of the GPU.
        total: u8,
    },
    /// The instances together own more of an engine (NVDEC, JPEG, OFA, ...) than the GPU has.
    #[error("the instances need {used} {engine} engines, but {model} has {total}{}", holders_phrase(holders))]
    EnginesExceeded {
        /// Engine kind, e.g. `ofa`.
        engine: &'static str,
        /// The GPU model.
        model: String,
        /// Engines the layout needs.
        used: u32,
        /// Engines of the GPU.
        total: u8,
        /// Profiles that need the engine.
        holders: Vec<String>,
    },
    /// Instances given without a start cannot all be placed next to the placed ones.
    #[error("no placement fits {} on {model} next to the placed instances (free units: {})", profiles.join(", "), if free_units.is_empty() { "none".to_string() } else { join_units(free_units) })]
    NoPlacement {
        /// The unplaced profiles, in input order.
        profiles: Vec<String>,
        /// The GPU model.
        model: String,
        /// Units not covered by placed instances.
        free_units: Vec<u8>,
    },
}

/// A layout error as a machine-readable code and a human message (the CLI's and API's wire form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Stable code, e.g. `mig_placement_not_allowed`.
    pub code: &'static str,
    /// What is wrong, for people.
    pub message: String,
}

impl LayoutError {
    /// The stable machine-readable code of this kind of problem.
    pub fn code(&self) -> &'static str {
        match self {
            LayoutError::UnknownProfile { .. } => "mig_unknown_profile",
            LayoutError::PlacementNotAllowed { .. } => "mig_placement_not_allowed",
            LayoutError::Overlap { .. } => "mig_overlap",
            LayoutError::TooManyInstances { .. } => "mig_too_many_instances",
            LayoutError::ComputeSlicesExceeded { .. } => "mig_compute_slices_exceeded",
            LayoutError::EnginesExceeded { .. } => "mig_engines_exceeded",
            LayoutError::NoPlacement { .. } => "mig_no_placement",
        }
    }

    /// Code and message together.
    pub fn problem(&self) -> Problem {
        Problem { code: self.code(), message: self.to_string() }
    }
}

fn holders_phrase(holders: &[String]) -> String {
    if holders.is_empty() { String::new() } else { format!(" (needed by {})", holders.join(", ")) }
}

fn join_units(units: &[u8]) -> String {
    units.iter().map(u8::to_string).collect::<Vec<_>>().join(", ")
}

fn units_phrase(units: &[u8]) -> String {
    match units {
        [one] => format!("unit {one}"),
        [first, .., last] if usize::from(last - first) + 1 == units.len() => {
            format!("units {first}-{last}")
        }
        _ => format!("units {}", join_units(units)),
    }
}
