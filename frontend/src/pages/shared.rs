//! What more than one page uses: ids and slice specs in words, URL encoding, and the quota ask a tenant's admin is
//! drafting. Page-to-page sharing goes through here (or through `crate::widgets` for components every page shows):
//! this module imports no page, so no page ever imports a sibling page that imports it back.

use leptos::prelude::*;
use tessera_core::request::{RequestState, SliceSpec};

/// The last 8 characters of an id (UUIDv7s share their first ones, the time).
pub fn short(id: &str) -> String {
    id.chars().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect()
}

/// `3 × MIG 1g.10gb on H100-80GB`, `1 × H100-80GB (time-sliced 1/4)`.
pub fn describe(spec: &SliceSpec, count: u32) -> String {
    let what = match spec {
        SliceSpec::Mig { profile, model: Some(m) } => format!("MIG {profile} on {m}"),
        SliceSpec::Mig { profile, model: None } => format!("MIG {profile}"),
        SliceSpec::Timeslice { model, replicas } => format!("{model} time-sliced 1/{replicas}"),
        SliceSpec::Mps { model, replicas } => format!("{model} MPS 1/{replicas}"),
        SliceSpec::Exclusive { model } => format!("whole {model}"),
    };
    format!("{count} × {what}")
}

/// `pending`, `active`, ... as the API writes them.
pub fn state_name(s: RequestState) -> String {
    serde_json::to_value(s).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// Percent-encodes everything but unreserved characters.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What a tenant's admin is about to ask for: rows of (resource key, amount as typed), shared by the quota bars'
/// "Ask for more", the request form's "Ask for exactly what is missing" and the ask form itself.
#[derive(Debug, Clone, Copy)]
pub struct AskDraft {
    /// The rows.
    pub lines: RwSignal<Vec<(String, String)>>,
    /// Whether the form is open.
    pub open: RwSignal<bool>,
}

impl AskDraft {
    /// An empty, closed draft.
    pub fn new() -> AskDraft {
        AskDraft { lines: RwSignal::new(Vec::new()), open: RwSignal::new(false) }
    }

    /// Replaces the rows and opens the form.
    pub fn fill(&self, lines: Vec<(String, String)>) {
        self.lines.set(lines);
        self.open.set(true);
        #[cfg(feature = "hydrate")]
        if let Some(el) = leptos::prelude::document().get_element_by_id("ask-quota") {
            el.scroll_into_view();
        }
    }

    /// Adds a row for `resource` (or replaces the one there) and opens the form.
    pub fn add(&self, resource: String, amount: String) {
        let mut lines = self.lines.get_untracked();
        lines.retain(|(r, _)| *r != resource);
        lines.push((resource, amount));
        self.fill(lines);
    }
}

impl Default for AskDraft {
    fn default() -> Self {
        AskDraft::new()
    }
}

/// Who runs a GPU process, in words: `pod ml-a/train-0 (container main), pid 9`, `python3 of ann, pid 7`.
pub fn who_runs(
    pid: u32,
    user: Option<&str>,
    command: Option<&str>,
    pod: Option<&tessera_core::attribution::PodRef>,
) -> String {
    let what = match (pod, user, command) {
        (Some(pod), _, _) => format!("pod {}/{} (container {})", pod.namespace, pod.pod, pod.container),
        (None, Some(user), Some(cmd)) => format!("{cmd} of {user}"),
        (None, Some(user), None) => format!("a process of {user}"),
        (None, None, Some(cmd)) => cmd.to_string(),
        (None, None, None) => "a process".to_string(),
    };
    format!("{what}, pid {pid}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_naturally() {
        let spec = SliceSpec::Timeslice { model: "A100-80GB".into(), replicas: 4 };
        assert_eq!(describe(&spec, 2), "2 × A100-80GB time-sliced 1/4");
        assert_eq!(state_name(RequestState::Provisioning), "provisioning");
        assert_eq!(short("0193-abcdef12"), "abcdef12");
    }
}
