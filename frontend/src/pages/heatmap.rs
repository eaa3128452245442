//! `/heatmap`: utilisation (or memory) per GPU and MIG instance over time, on a canvas.
//!
//! Rows are GPUs grouped by node, each followed by its MIG instances (a GPU's instances fold away with a click on
//! its label); columns are time: the last 15 minutes at 1 s from the server's live window, or the last 24 hours at
//! 1 min from the stored series. In the live view the server's event stream (`/api/v1/telemetry/live`) brings every
//! sample (several per device when they arrive together) and moves the window without a reload; rows of devices
//! first seen in the stream are added, and who holds each row is fetched again every 15 s.
//!
//! Rows are as tall as the space below the toolbar allows (14 to 36 px); a time axis runs under the canvas; the
//! tooltip follows the pointer; cells without a sample have their own colour in each theme (the legend's "no
//! sample"). The canvas says, in `data-lag-p50`/`data-lag-p95` (ms), how long samples took from the agent to the
//! pixel over the last 600 drawn.
//!
//! Drawing: one RGBA pixel per cell is written into an image of `columns × rows`, which the browser scales onto the
//! visible canvas in one `drawImage` (no per-cell draw calls), so 1,000 rows × 900 columns stay well inside a frame.
//! `/heatmap?bench=1000x900` measures that against per-cell `fillRect` drawing in the same page.
//!
//! A fleet taller than the window scrolls inside the heatmap's box, and only the rows in view (and a few beyond)
//! exist: their labels, their markers, and a canvas as tall as they are, placed where they sit; a spacer keeps the
//! whole height. 10,000 rows cost what 100 do, per frame. `/heatmap?synthetic=10000x900` shows a synthetic fleet
//! of that size with a new column of samples every second, as the live stream brings them, and the canvas says in
//! `data-draw-p50`/`data-draw-p95`/`data-draw-max` (ms) how long its last 120 frames took, samples taken in
//! included.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;
use tessera_api::telemetry::{Heatmap, HeatmapRow, Latest, Metric};
use tessera_core::api::Sample;

use crate::api;
use crate::widgets::problem_view;

/// Smallest and largest row height, CSS pixels.
pub const ROW_MIN: u32 = 14;
/// See [`ROW_MIN`].
pub const ROW_MAX: u32 = 36;

/// Row height for `rows` rows in `space` CSS pixels of height.
pub fn row_height(space: f64, rows: usize) -> u32 {
    let per = space / rows.max(1) as f64;
    (per.floor().max(0.0) as u32).clamp(ROW_MIN, ROW_MAX)
}

/// Time-axis ticks for `[from_ms, to_ms)`: a round interval giving at most `max` ticks, as (fraction of the width,
/// time).
pub fn ticks(from_ms: i64, to_ms: i64, max: usize) -> Vec<(f64, i64)> {
    const STEPS_MIN: [i64; 11] = [1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720];
    let span = (to_ms - from_ms).max(1);
    let step = STEPS_MIN.iter().map(|m| m * 60_000).find(|s| span / s < max.max(1) as i64).unwrap_or(86_400_000);
    let mut t = from_ms - from_ms.rem_euclid(step) + step;
    let mut out = Vec::new();
    while t < to_ms {
        out.push(((t - from_ms) as f64 / span as f64, t));
        t += step;
    }
    out
}

/// The metric's name in a query (`util`, `mem_pct`, ...), as the API writes it.
pub fn metric_name(metric: Metric) -> String {
    serde_json::to_value(metric).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// `demo-node-1 · GPU 0`, or for a MIG instance `demo-node-1 · GPU 0 · 1g.10gb@6`: every row names its node and
/// Who runs on a row's device, for its label's title: `python3 of ann, pid 7; pod ml-a/train-0 (container
/// main), pid 9`; empty when nobody the caller may see does.
pub fn runs_text(row: &HeatmapRow) -> String {
    row.processes
        .iter()
        .map(|p| crate::pages::shared::who_runs(p.pid, p.user.as_deref(), p.command.as_deref(), p.pod.as_ref()))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The marker of a row's unallocated use: `2 processes use this device without an allocation`.
pub fn unallocated_text(row: &HeatmapRow) -> Option<String> {
    match row.unallocated {
        0 => None,
        1 => Some("1 process uses this device without an allocation".to_string()),
        n => Some(format!("{n} processes use this device without an allocation")),
    }
}
/// GPU (a tenant sees its instances without their GPU's row).
pub fn label(row: &HeatmapRow) -> String {
    if is_group(row) {
        return row.node.clone();
    }
    let gpu = format!("{} · GPU {}", row.node, row.gpu_index.map_or_else(|| "?".into(), |i| i.to_string()));
    match (&row.profile, row.start) {
        (Some(p), Some(s)) => format!("{gpu} · {p}@{s}"),
        _ => gpu,
    }
}

/// What the live view does with a heatmap from the API: take in the samples of the event stream, and adopt a
/// fresh fetch for rows the stream added.
pub trait LiveHeatmap {
    /// The value a live sample gives for this heatmap's metric.
    fn value_of(&self, s: &Sample) -> Option<f32>;

    /// Fills in what rows added from the stream lack (node name, GPU index, model, who holds them) from a fresh
    /// fetch of the same heatmap, keeping the values. Returns whether anything changed.
    fn adopt(&mut self, fresh: &Heatmap) -> bool;

    /// Takes in live samples: the window moves on to the newest sample's column (older columns fall off the
    /// left), and each sample lands in its column. Unknown devices get a row after their GPU's. Returns whether
    /// anything changed.
    fn apply(&mut self, samples: &[Latest]) -> bool;

    /// Takes in the last columns of the same heatmap fetched later (`tail`, same step, columns on the same grid):
    /// the window moves on to its end, and its values land in their rows and columns (a row it adds goes last).
    /// How a grouped heatmap stays live without a sample per device. Returns whether anything changed.
    fn merge(&mut self, tail: &Heatmap) -> bool;
}

impl LiveHeatmap for Heatmap {
    fn value_of(&self, s: &Sample) -> Option<f32> {
        match self.metric {
            Metric::Util => Some(s.util),
            Metric::MemPct => (s.mem_total_mib > 0.0).then(|| s.mem_used_mib / s.mem_total_mib * 100.0),
            Metric::MemUsed => Some(s.mem_used_mib),
            Metric::Power => s.power_w,
            Metric::Temp => s.temp_c,
        }
    }

    fn adopt(&mut self, fresh: &Heatmap) -> bool {
        let mut changed = false;
        for row in &mut self.rows {
            let Some(f) = fresh.rows.iter().find(|f| f.device == row.device) else { continue };
            if row.allocations != f.allocations
                || row.node != f.node
                || row.gpu_index != f.gpu_index
                || row.health != f.health
                || row.health_marks != f.health_marks
                || row.processes != f.processes
                || row.unallocated != f.unallocated
            {
                row.processes = f.processes.clone();
                row.unallocated = f.unallocated;
                row.allocations = f.allocations.clone();
                row.node = f.node.clone();
                row.gpu_index = f.gpu_index;
                row.model = f.model.clone();
                row.health = f.health;
                row.health_marks = f.health_marks.clone();
                changed = true;
            }
        }
        changed
    }

    fn apply(&mut self, samples: &[Latest]) -> bool {
        let mut changed = false;
        let step = self.step_ms.max(1);
        if let Some(newest) = samples.iter().map(|s| s.sample.t).max() {
            let end = self.from_ms + step * self.columns as i64;
            if newest >= end {
                let shift = ((newest - end) / step + 1) as usize;
                self.from_ms += step * shift as i64;
                self.to_ms = self.from_ms + step * self.columns as i64;
                for row in &mut self.rows {
                    let k = shift.min(row.values.len());
                    row.values.drain(..k);
                    row.values.resize(self.columns, None);
                }
                changed = true;
            }
        }
        let mut index: std::collections::HashMap<String, usize> =
            self.rows.iter().enumerate().map(|(i, r)| (r.device.clone(), i)).collect();
        for s in samples {
            let col = (s.sample.t - self.from_ms).div_euclid(step);
            if col < 0 || col >= self.columns as i64 {
                continue;
            }
            let Some(v) = self.value_of(&s.sample) else { continue };
            let i = match index.get(&s.device) {
                Some(&i) => i,
                None => {
                    let after = self.rows.iter().rposition(|r| r.gpu_uuid == s.gpu);
                    let like = after.map(|i| self.rows[i].clone());
                    let row = HeatmapRow {
                        node_id: s.node_id.clone(),
                        node: like.as_ref().map_or_else(|| s.node_id.clone(), |r| r.node.clone()),
                        gpu_uuid: s.gpu.clone(),
                        gpu_index: like.as_ref().and_then(|r| r.gpu_index),
                        model: like.as_ref().and_then(|r| r.model.clone()),
                        device: s.device.clone(),
                        kind: if s.profile.is_some() { "mig" } else { "gpu" }.into(),
                        profile: s.profile.clone(),
                        start: s.start,
                        allocations: vec![],
                        values: vec![None; self.columns],
                        health: None,
                        health_marks: vec![],
                        processes: vec![],
                        unallocated: 0,
                    };
                    let at = after.map_or(self.rows.len(), |i| i + 1);
                    self.rows.insert(at, row);
                    index = self.rows.iter().enumerate().map(|(i, r)| (r.device.clone(), i)).collect();
                    at
                }
            };
            self.rows[i].values[col as usize] = Some(v);
            changed = true;
        }
        changed
    }

    fn merge(&mut self, tail: &Heatmap) -> bool {
        let step = self.step_ms.max(1);
        if tail.step_ms != step || (tail.from_ms - self.from_ms).rem_euclid(step) != 0 {
            return false;
        }
        let mut changed = false;
        let end = self.from_ms + step * self.columns as i64;
        if tail.to_ms > end {
            let shift = ((tail.to_ms - end + step - 1) / step) as usize;
            self.from_ms += step * shift as i64;
            self.to_ms = self.from_ms + step * self.columns as i64;
            for row in &mut self.rows {
                let k = shift.min(row.values.len());
                row.values.drain(..k);
                row.values.resize(self.columns, None);
            }
            changed = true;
        }
        for t in &tail.rows {
            let i = match self.rows.iter().position(|r| r.device == t.device) {
                Some(i) => i,
                None => {
                    self.rows.push(HeatmapRow { values: vec![None; self.columns], ..t.clone() });
                    self.rows.len() - 1
                }
            };
            for (c, v) in t.values.iter().enumerate() {
                let col = (tail.from_ms + c as i64 * step - self.from_ms) / step;
                let Some(v) = *v else { continue };
                let cell = usize::try_from(col).ok().and_then(|col| self.rows[i].values.get_mut(col));
                if let Some(cell) = cell.filter(|cell| **cell != Some(v)) {
                    *cell = Some(v);
                    changed = true;
                }
            }
        }
        changed
    }
}

/// Viridis (perceptually even, readable with the common colour-vision deficiencies), 0 to 1.
const VIRIDIS: [[u8; 3]; 9] = [
    [68, 1, 84],
    [71, 44, 122],
    [59, 81, 139],
    [44, 113, 142],
    [33, 144, 141],
    [39, 173, 129],
    [92, 200, 99],
    [170, 220, 50],
    [253, 231, 37],
];

/// A health marker as drawn: on the `row`-th visible row, at `x` (0-1 of the width), of what `device`.
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    /// Index among the visible rows.
    pub row: usize,
    /// Horizontal position, a fraction of the heatmap's width.
    pub x: f64,
    /// `healthy`, `degraded` or `unhealthy`.
    pub state: &'static str,
    /// The GPU's device (its row).
    pub device: String,
    /// When, UTC ms.
    pub at_ms: i64,
    /// What it says: the state, the time and the findings' codes.
    pub title: String,
}

/// The health markers of the visible rows that fall within the heatmap's range.
pub fn markers(h: &Heatmap, rows: &[&HeatmapRow]) -> Vec<Marker> {
    let span = (h.to_ms - h.from_ms).max(1) as f64;
    rows.iter()
        .enumerate()
        .flat_map(|(i, r)| {
            r.health_marks.iter().filter(|m| m.at_ms >= h.from_ms && m.at_ms < h.to_ms).map(move |m| {
                let state = m.state.as_str();
                let why = if m.codes.is_empty() { String::new() } else { format!(": {}", m.codes.join(", ")) };
                Marker {
                    row: i,
                    x: (m.at_ms - h.from_ms) as f64 / span,
                    state,
                    device: r.device.clone(),
                    at_ms: m.at_ms,
                    title: format!("{} turned {state} at {}{why}", label(r), crate::pages::clock(m.at_ms)),
                }
            })
        })
        .collect()
}

/// The colour of `v` on a 0..=`max` scale; `None` (no sample) is drawn as `empty`.
pub fn colour(v: Option<f32>, max: f32, empty: [u8; 3]) -> [u8; 3] {
    let Some(v) = v else { return empty };
    let x = (v / max.max(f32::EPSILON)).clamp(0.0, 1.0) * (VIRIDIS.len() - 1) as f32;
    let i = (x.floor() as usize).min(VIRIDIS.len() - 2);
    let f = x - i as f32;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    [0, 1, 2].map(|k| (f32::from(a[k]) + (f32::from(b[k]) - f32::from(a[k])) * f).round() as u8)
}

/// The scale's top for a metric: 100 for percentages, else the largest value seen.
pub fn scale_max(h: &Heatmap, rows: &[&HeatmapRow]) -> f32 {
    match h.unit.as_str() {
        "%" => 100.0,
        _ => rows.iter().flat_map(|r| r.values.iter().flatten()).fold(1.0_f32, |m, v| m.max(*v)),
    }
}

/// Rows rendered beyond the ones in view, above and below.
pub const OVERSCAN: usize = 12;

/// The rows shown: every GPU (or group), and the instances of GPUs not folded.
pub fn visible<'a>(h: &'a Heatmap, folded: &std::collections::HashSet<String>) -> Vec<&'a HeatmapRow> {
    h.rows.iter().filter(|r| r.kind != "mig" || !folded.contains(&r.gpu_uuid)).collect()
}

/// Whether a row is a node's or a model's group ([`grouped_rows`]).
pub fn is_group(row: &HeatmapRow) -> bool {
    row.kind == "node" || row.kind == "model"
}

/// Which heatmap the page shows: the range, the metric, and the rows (`group`: `node` or `model`, or one row per
/// device; `node` and `model` narrow it), as the page's address says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    /// `live` or `day`.
    pub range: String,
    /// `util`, `mem_pct`, ...
    pub metric: String,
    /// `node`, `model`, or `None` for a row per device.
    pub group: Option<String>,
    /// One node (its name).
    pub node: Option<String>,
    /// One GPU model (its key).
    pub model: Option<String>,
}

impl View {
    /// The filters of the API's query: `&group=..&node=..&model=..`.
    pub fn filters(&self) -> String {
        let mut q = String::new();
        for (k, v) in [("group", &self.group), ("node", &self.node), ("model", &self.model)] {
            if let Some(v) = v {
                q.push_str(&format!("&{k}={}", crate::pages::shared::encode(v)));
            }
        }
        q
    }

    /// The heatmap's API path at `now_ms`: the live window at 1 s, or the last 24 hours at a minute (at 10 minutes
    /// for groups, whose rows are a fleet's nodes).
    pub fn path(&self, now_ms: i64) -> String {
        let metric = &self.metric;
        let range = if self.range == "day" {
            let step = if self.group.is_some() { 600 } else { 60 };
            format!("&from={}&step={step}", now_ms - 86_400_000)
        } else {
            String::new()
        };
        format!("/api/v1/telemetry/heatmap?metric={metric}{range}{}", self.filters())
    }

    /// The page's address for a group's row: a node's devices, or a model's nodes.
    pub fn drill(&self, row: &HeatmapRow) -> String {
        let mut to = View { range: String::new(), metric: String::new(), ..View::default() };
        match row.kind.as_str() {
            "node" => {
                to.node = Some(row.node.clone());
                to.model = self.model.clone();
            }
            _ => {
                to.group = Some("node".into());
                to.model = row.model.clone();
            }
        }
        format!("/heatmap?{}", to.filters().trim_start_matches('&'))
    }
}

/// A grouped heatmap's groups as rows the page draws like devices' (kind `node` or `model`, keyed by the group's
/// key in `device` and `gpu_uuid`), and each group's device count by key.
pub fn grouped_rows(h: &mut Heatmap, kind: &str) -> std::collections::HashMap<String, u32> {
    let groups = h.groups.take().unwrap_or_default();
    let counts = groups.iter().map(|g| (g.key.clone(), g.devices)).collect();
    h.rows = groups
        .into_iter()
        .map(|g| HeatmapRow {
            node_id: if kind == "node" { g.key.clone() } else { String::new() },
            node: g.name,
            gpu_uuid: g.key.clone(),
            gpu_index: None,
            model: (kind == "model").then(|| g.key.clone()),
            device: g.key,
            kind: kind.to_string(),
            profile: None,
            start: None,
            allocations: vec![],
            values: g.values,
            health: None,
            health_marks: vec![],
            processes: vec![],
            unallocated: 0,
        })
        .collect();
    counts
}

/// 256 colours from 0 to the top of the scale.
fn ramp() -> &'static [[u8; 4]; 256] {
    static RAMP: std::sync::OnceLock<[[u8; 4]; 256]> = std::sync::OnceLock::new();
    RAMP.get_or_init(|| {
        std::array::from_fn(|i| {
            let c = colour(Some(i as f32), 255.0, [0, 0, 0]);
            [c[0], c[1], c[2], 255]
        })
    })
}

/// RGBA pixels, one per cell, `columns` wide and `rows.len()` high.
pub fn pixels(rows: &[&HeatmapRow], columns: usize, max: f32, empty: [u8; 3]) -> Vec<u8> {
    let mut out = vec![0u8; rows.len() * columns * 4];
    pixels_into(&mut out, rows, columns, max, empty);
    out
}

/// [`pixels`] into a buffer of the right size.
pub fn pixels_into(out: &mut [u8], rows: &[&HeatmapRow], columns: usize, max: f32, empty: [u8; 3]) {
    let ramp = ramp();
    let gap = [empty[0], empty[1], empty[2], 255];
    let k = 255.0 / max.max(f32::EPSILON);
    for (row, line) in rows.iter().zip(out.chunks_exact_mut(columns * 4)) {
        for (x, px) in line.chunks_exact_mut(4).enumerate() {
            let c = match row.values.get(x).copied().flatten() {
                Some(v) => &ramp[(v * k).clamp(0.0, 255.0) as usize],
                None => &gap,
            };
            px.copy_from_slice(c);
        }
    }
}

/// The heatmap page.
#[component]
pub fn HeatmapPage() -> impl IntoView {
    let query = use_query_map();
    let bench = move || query.read().get("bench");
    let synthetic_spec = move || query.read().get("synthetic");
    let range = RwSignal::new("live".to_string());
    let metric = RwSignal::new("util".to_string());
    // The rows asked for by the address: a group (`?group=node|model`), one node's or one model's devices.
    let asked = Memo::new(move |_| {
        let q = query.read();
        let pick = |k: &str| q.get(k).filter(|v| !v.is_empty());
        (pick("group").filter(|g| g == "node" || g == "model"), pick("node"), pick("model"))
    });
    let view_of = move || {
        let (group, node, model) = asked.get();
        View { range: range.get(), metric: metric.get(), group, node, model }
    };
    // The rows shown: a group's kind when the answer has groups (asked for, or chosen because the fleet has more
    // devices than one heatmap holds), and whether the page chose it.
    let shown_group = RwSignal::new(None::<(String, bool)>);
    let counts = RwSignal::new(std::collections::HashMap::<String, u32>::new());
    let data = Resource::new(
        move || (view_of(), bench(), synthetic_spec().is_some()),
        |(view, bench, synthetic_fleet)| async move {
            if let Some(spec) = bench {
                return Ok((synthetic(&spec), None));
            }
            // A synthetic fleet is made in the browser (the effect below): as page data it would not fit the page.
            if synthetic_fleet {
                return Ok((synthetic("1x1"), None));
            }
            let now = crate::pages::now_ms();
            match api::get_json::<Heatmap>(view.path(now)).await {
                // A row per device would not fit one answer: a row per node, each a link to its devices.
                Err(p) if p.code == "heatmap_too_large" && view.group.is_none() && view.node.is_none() => {
                    let by_node = View { group: Some("node".into()), ..view };
                    let h = api::get_json::<Heatmap>(by_node.path(now)).await?;
                    Ok((h, Some(("node".to_string(), true))))
                }
                Err(p) => Err(p),
                Ok(h) => {
                    let group = view.group.filter(|_| h.groups.is_some()).map(|g| (g, false));
                    Ok((h, group))
                }
            }
        },
    );
    let folded = RwSignal::new(std::collections::HashSet::<String>::new());
    let live = RwSignal::new(None::<Heatmap>);
    let hover = RwSignal::new(None::<(String, i32, i32)>);
    let row_h = RwSignal::new(ROW_MIN);
    let canvas = NodeRef::<leptos::html::Canvas>::new();
    // The scrolling box, its height (the space below it in the window) and the rows in view.
    let boxed = NodeRef::<leptos::html::Div>::new();
    let box_h = RwSignal::new(600.0_f64);
    let scroll = crate::widgets::ScrollWatch::new(600.0);
    scroll.follow(boxed);
    let shown = Memo::new(move |_| live.with(|h| h.as_ref().map_or(0, |h| folded.with(|f| visible(h, f).len()))));
    let window = Memo::new(move |_| scroll.rows(f64::from(row_h.get()), shown.get(), OVERSCAN));
    Effect::new(move || {
        if let Some(Ok((h, group))) = data.get() {
            let mut h = match synthetic_spec() {
                Some(spec) => synthetic(&spec),
                None => h,
            };
            if let Some((kind, _)) = &group {
                counts.set(grouped_rows(&mut h, kind));
            }
            shown_group.set(group);
            // Large fleets start folded to GPUs.
            if h.rows.iter().filter(|r| r.kind == "gpu").count() > 200 {
                folded.set(h.rows.iter().map(|r| r.gpu_uuid.clone()).collect());
            }
            live.set(Some(h));
        }
    });
    #[cfg(feature = "hydrate")]
    draw::wire(draw::Wiring {
        canvas,
        boxed,
        box_h,
        window,
        live,
        folded,
        hover,
        row_h,
        range,
        view: Signal::derive(view_of),
        shown_group,
        counts,
        benchmark: bench().is_some(),
        synthetic: synthetic_spec().is_some(),
    });
    let navigate = leptos_router::hooks::use_navigate();
    let rows_choice = move || shown_group.get().map_or_else(String::new, |(g, _)| g);

    view! {
        <section class="page wide">
            <div class="title-row">
                <h1>"Utilisation"</h1>
                <div class="toolbar">
                    <label>"Range"
                        <select prop:value=move || range.get() on:change=move |ev| range.set(event_target_value(&ev))>
                            <option value="live">"Last 15 min, 1 s (live)"</option>
                            <option value="day">"Last 24 h, 1 min"</option>
                        </select>
                    </label>
                    <label>"Show"
                        <select prop:value=move || metric.get() on:change=move |ev| metric.set(event_target_value(&ev))>
                            <option value="util">"Utilisation"</option>
                            <option value="mem_pct">"Memory used"</option>
                        </select>
                    </label>
                    <label>"Rows"
                        <select data-testid="heatmap-rows" prop:value=rows_choice on:change=move |ev| {
                            let group = event_target_value(&ev);
                            let to = View { group: (!group.is_empty()).then_some(group), model: asked.get_untracked().2, ..View::default() };
                            navigate(&format!("/heatmap?{}", to.filters().trim_start_matches('&')), Default::default());
                        }>
                            <option value="">"Each device"</option>
                            <option value="node">"One per node"</option>
                            <option value="model">"One per GPU model"</option>
                        </select>
                    </label>
                </div>
            </div>
            {move || {
                let (_, node, model) = asked.get();
                let auto = shown_group.get().is_some_and(|(_, auto)| auto);
                let scope = match (node, model) {
                    (Some(n), _) => Some(format!("Node {n}")),
                    (None, Some(m)) => Some(format!("GPU model {m}")),
                    _ => None,
                };
                view! {
                    {scope.map(|s| view! { <p class="small" data-testid="heatmap-scope">{s}" · "<a href="/heatmap">"Whole fleet"</a></p> })}
                    {auto.then(|| view! { <p class="notice" data-testid="heatmap-grouped">"One row per node: the fleet has more devices than one heatmap shows at this range. Pick a node to see its devices."</p> })}
                }
            }}
            <Legend />
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match data.await {
                        Err(p) => problem_view(&p),
                        Ok((h, _)) if h.rows.is_empty() && h.groups.as_ref().is_none_or(Vec::is_empty) => view! { <p class="notice">"No samples in this range yet. Devices appear here once their agent reports them (and, for tenants, once you hold a slice on them)."</p> }.into_any(),
                        Ok(_) => ().into_any(),
                    }
                })}
            </Transition>
            <div class="heatmap" data-testid="heatmap" style=move || format!("--hm-row:{}px", row_h.get())>
                <div class="hm-scroll" node_ref=boxed data-testid="heatmap-scroll" style=move || format!("max-height:{:.0}px", box_h.get())>
                <ol class="hm-labels" data-rows=move || shown.get().to_string() style=move || {
                    let (w, rh) = (window.get(), f64::from(row_h.get()));
                    format!("height:{}px;padding-top:{}px", shown.get() as f64 * rh, w.start as f64 * rh)
                }>
                    {move || live.with(|h| {
                        let Some(h) = h else { return Vec::new() };
                        let f = folded.get();
                        let w = window.get();
                        let rows = visible(h, &f);
                        let w = w.start.min(rows.len())..w.end.min(rows.len());
                        rows[w].iter().map(|r| {
                            if is_group(r) {
                                let devices = counts.with(|c| c.get(&r.device).copied().unwrap_or(0));
                                let href = view_of().drill(r);
                                let what = if r.kind == "node" { "node" } else { "GPU model" };
                                let title = format!("{} · the mean of {devices} devices · open this {what}", r.node);
                                return view! {
                                    <li class="gpu group" data-device=r.device.clone() data-testid="heatmap-group" title=title>
                                        <span class="fold"></span>
                                        <a class="name" href=href>{r.node.clone()}</a>
                                        <span class="tenants">{format!("{devices} devices")}</span>
                                    </li>
                                }.into_any();
                            }
                            let gpu = r.gpu_uuid.clone();
                            let is_gpu = r.kind == "gpu";
                            let has_instances = is_gpu && h.rows.iter().any(|o| o.kind == "mig" && o.gpu_uuid == r.gpu_uuid);
                            let open = !f.contains(&r.gpu_uuid);
                            let tenants = r.allocations.iter().map(|a| a.tenant.clone()).collect::<Vec<_>>().join(", ");
                            let runs = runs_text(r);
                            let title = format!("{} · {}{}{}", label(r), r.device, r.model.as_ref().map(|m| format!(" · {m}")).unwrap_or_default(),
                                if runs.is_empty() { String::new() } else { format!(" · runs: {runs}") });
                            let stray = unallocated_text(r);
                            let stray_count = r.unallocated;
                            view! {
                                <li class:gpu=is_gpu class:mig=!is_gpu data-device=r.device.clone() title=title>
                                    {if has_instances {
                                        view! { <button class="fold" aria-expanded=open.to_string() aria-label="Show or hide this GPU's MIG instances" on:click=move |_| folded.update(|s| { if !s.remove(&gpu) { s.insert(gpu.clone()); } })>{if open { "▾" } else { "▸" }}</button> }.into_any()
                                    } else { view! { <span class="fold"></span> }.into_any() }}
                                    <span class="name">{label(r)}</span>
                                    {r.health.filter(|s| *s != tessera_core::health::HealthState::Healthy).map(|s| view! {
                                        <span class=format!("health-badge {}", s.as_str()) data-testid="health-badge" data-state=s.as_str()>{s.as_str()}</span>
                                    })}
                                    {stray.map(|t| view! {
                                        <span class="hm-stray" data-testid="unallocated-marker" data-count=stray_count.to_string() title=t.clone() aria-label=t>{format!("⚠ {stray_count}")}</span>
                                    })}
                                    {(!tenants.is_empty()).then(|| view! { <span class="tenants">{tenants}</span> })}
                                </li>
                            }.into_any()
                        }).collect::<Vec<_>>()
                    })}
                </ol>
                <div class="hm-canvas" style=move || format!("height:{}px", shown.get() as u32 * row_h.get())>
                    <canvas node_ref=canvas data-testid="heatmap-canvas" aria-label="Heatmap: rows are devices, columns are time"></canvas>
                    <div class="hm-marks" aria-label="Health changes">
                        {move || live.with(|h| h.as_ref().map(|h| {
                            let f = folded.get();
                            let rows = visible(h, &f);
                            let w = window.get();
                            let rows = &rows[w.start.min(rows.len())..w.end.min(rows.len())];
                            let row_px = row_h.get();
                            markers(h, rows).into_iter().map(|m| Marker { row: m.row + w.start, ..m }).map(|m| view! {
                                <span class=format!("hm-mark {}", m.state) data-testid="health-marker" data-state=m.state data-device=m.device data-at=m.at_ms
                                    title=m.title.clone() aria-label=m.title
                                    style=format!("left:{:.3}%;top:{}px;height:{row_px}px", m.x * 100.0, m.row as u32 * row_px)></span>
                            }).collect::<Vec<_>>()
                        }))}
                    </div>
                </div>
                </div>
                <div class="hm-foot">
                    <div class="hm-ticks small muted" data-testid="time-axis" aria-hidden="true">
                        {move || live.with(|h| h.as_ref().map(|h| ticks(h.from_ms, h.to_ms, 8).into_iter().map(|(x, t)| {
                            view! { <span class="tick" style=format!("left:{:.3}%", x * 100.0)>{crate::pages::clock(t)}</span> }
                        }).collect::<Vec<_>>()))}
                    </div>
                    <div class="hm-axis small muted">{move || live.with(|h| h.as_ref().map(axis_text))}</div>
                </div>
            </div>
            <div class="tooltip" role="status" data-testid="tooltip" class:shown=move || hover.get().is_some()
                style=move || hover.get().map(|(_, x, y)| format!("left:{}px;top:{}px", x + 14, y + 14)).unwrap_or_default()>
                {move || hover.get().map(|(t, _, _)| t)}
            </div>
            {move || bench().map(|_| view! { <pre class="bench" data-testid="bench">"measuring…"</pre> })}
        </section>
    }
}

fn axis_text(h: &Heatmap) -> String {
    let minutes = (h.step_ms * h.columns as i64) / 60_000;
    let step =
        if h.step_ms >= 60_000 { format!("{} min", h.step_ms / 60_000) } else { format!("{} s", h.step_ms / 1000) };
    format!(
        "{minutes} min to now · one column per {step} · {}",
        match h.source.as_str() {
            "live" => "live",
            "ten_minutes" => "stored 10-minute means",
            "hours" => "stored hourly means",
            _ => "stored minutes",
        }
    )
}

#[component]
fn Legend() -> impl IntoView {
    let stops: Vec<String> = (0..=8)
        .map(|i| {
            let c = colour(Some(i as f32 / 8.0), 1.0, [0, 0, 0]);
            format!("rgb({},{},{}) {}%", c[0], c[1], c[2], i * 100 / 8)
        })
        .collect();
    view! {
        <div class="hm-legend small" aria-label="Colour scale: dark purple is 0, yellow is the top of the scale">
            <span>"0"</span>
            <span class="ramp" style=format!("background:linear-gradient(to right,{})", stops.join(","))></span>
            <span>"100 %"</span>
            <span class="key nodata"></span><span>"no sample"</span>
        </div>
    }
}

/// A deterministic synthetic heatmap of `ROWSxCOLUMNS` (e.g. `1000x900`) for the drawing benchmark.
pub fn synthetic(spec: &str) -> Heatmap {
    let (rows, columns) =
        spec.split_once('x').and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?))).unwrap_or((1000, 900));
    let (rows, columns): (usize, usize) = (rows.clamp(1, 20_000), columns.clamp(1, 4000));
    let mut seed: u32 = 0x9e37_79b9;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        (seed % 1000) as f32 / 10.0
    };
    Heatmap {
        metric: Metric::Util,
        unit: Metric::Util.unit().into(),
        from_ms: 0,
        to_ms: 1000 * columns as i64,
        step_ms: 1000,
        columns,
        source: "live".into(),
        groups: None,
        rows: (0..rows)
            .map(|i| HeatmapRow {
                node_id: format!("n{}", i / 8),
                node: format!("bench-node-{}", i / 8),
                gpu_uuid: format!("GPU-{i}"),
                gpu_index: Some((i % 8) as u32),
                model: Some("H100-80GB".into()),
                device: format!("GPU-{i}"),
                kind: "gpu".into(),
                profile: None,
                start: None,
                allocations: vec![],
                values: (0..columns).map(|_| Some(next())).collect(),
                health: None,
                health_marks: vec![],
                processes: vec![],
                unallocated: 0,
            })
            .collect(),
    }
}

#[cfg(feature = "hydrate")]
mod draw {
    //! The browser half: drawing, hover, the live stream, the benchmark.

    use std::collections::HashSet;

    use leptos::prelude::*;
    use wasm_bindgen::prelude::*;
    use wasm_bindgen::{Clamped, JsCast};
    use web_sys::{CanvasRenderingContext2d, HtmlCanvasElement};

    use super::{Heatmap, Latest, LiveHeatmap, scale_max, visible};

    thread_local! {
        /// The cells' image (one pixel a cell) and its pixel buffer, kept from frame to frame.
        static SOURCE: std::cell::RefCell<Option<(HtmlCanvasElement, Vec<u8>)>> = const { std::cell::RefCell::new(None) };
        /// Times of the samples taken in since the last drawing, and the agent -> pixel lags of the last ones drawn.
        static LAGS: std::cell::RefCell<(Vec<i64>, std::collections::VecDeque<f64>)> = const { std::cell::RefCell::new((Vec::new(), std::collections::VecDeque::new())) };
    }

    /// How many lags the canvas's figures cover.
    const LAGS_KEPT: usize = 600;

    fn dark() -> bool {
        web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.document_element())
            .and_then(|e| e.get_attribute("data-theme"))
            .map_or_else(
                || {
                    web_sys::window()
                        .and_then(|w| w.match_media("(prefers-color-scheme: dark)").ok().flatten())
                        .is_some_and(|m| m.matches())
                },
                |t| t == "dark",
            )
    }

    /// "No sample": a light grey in the light theme, a mid grey in the dark one, both far from the palette's dark
    /// purple 0 (the legend's key uses the same colours, in `tessera.css`).
    fn empty_colour() -> [u8; 3] {
        if dark() { [122, 130, 142] } else { [226, 229, 234] }
    }

    fn context(c: &HtmlCanvasElement) -> Option<CanvasRenderingContext2d> {
        c.get_context("2d").ok().flatten()?.dyn_into().ok()
    }

    /// The space between the element's top and the bottom of the window (the axis below kept in view), CSS pixels.
    fn fitted_space(el: &web_sys::Element) -> f64 {
        let top =
            el.get_bounding_client_rect().top() + web_sys::window().and_then(|w| w.scroll_y().ok()).unwrap_or(0.0);
        let height = web_sys::window().and_then(|w| w.inner_height().ok()).and_then(|v| v.as_f64()).unwrap_or(800.0);
        height - top.min(height * 0.6) - 56.0
    }

    /// Draws the rows `window` of `h` (of those shown) on `canvas`, which is placed where they sit, with rows
    /// `row_h` CSS pixels high: one image of cells, scaled.
    pub fn render(
        canvas: &HtmlCanvasElement,
        h: &Heatmap,
        folded: &HashSet<String>,
        row_h: u32,
        window: std::ops::Range<usize>,
    ) -> Option<()> {
        let all = visible(h, folded);
        let window = window.start.min(all.len())..window.end.min(all.len());
        let rows = &all[window.clone()];
        let dpr = web_sys::window()?.device_pixel_ratio().max(1.0);
        let css_w = canvas.parent_element()?.client_width().max(200) as f64;
        let css_h = (rows.len() as u32 * row_h).max(1) as f64;
        let (w, hgt) = ((css_w * dpr) as u32, (css_h * dpr) as u32);
        let style = web_sys::HtmlElement::style(canvas);
        if canvas.width() != w || canvas.height() != hgt {
            canvas.set_width(w);
            canvas.set_height(hgt);
            let _ = style.set_property("width", &format!("{css_w}px"));
            let _ = style.set_property("height", &format!("{css_h}px"));
        }
        let _ = style.set_property("top", &format!("{}px", window.start as u32 * row_h));
        let _ = canvas.set_attribute("data-first-row", &window.start.to_string());
        let _ = canvas.set_attribute("data-columns", &h.columns.to_string());
        let ctx = context(canvas)?;
        if rows.is_empty() || h.columns == 0 {
            ctx.clear_rect(0.0, 0.0, w as f64, hgt as f64);
            return Some(());
        }
        let (cols, n) = (h.columns as u32, rows.len() as u32);
        let src = SOURCE.with(|cell| {
            let mut cell = cell.borrow_mut();
            let (src, buf) = match cell.as_mut() {
                Some(s) => s,
                None => {
                    let doc = web_sys::window()?.document()?;
                    let c: HtmlCanvasElement = doc.create_element("canvas").ok()?.dyn_into().ok()?;
                    cell.insert((c, Vec::new()))
                }
            };
            if src.width() != cols || src.height() != n {
                src.set_width(cols);
                src.set_height(n);
            }
            buf.resize((cols * n * 4) as usize, 0);
            super::pixels_into(buf, rows, h.columns, scale_max(h, rows), empty_colour());
            let image = web_sys::ImageData::new_with_u8_clamped_array_and_sh(Clamped(buf), cols, n).ok()?;
            context(src)?.put_image_data(&image, 0.0, 0.0).ok()?;
            Some(src.clone())
        })?;
        ctx.set_image_smoothing_enabled(false);
        ctx.draw_image_with_html_canvas_element_and_sw_and_sh_and_dx_and_dy_and_dw_and_dh(
            &src,
            0.0,
            0.0,
            h.columns as f64,
            rows.len() as f64,
            0.0,
            0.0,
            w as f64,
            hgt as f64,
        )
        .ok()?;
        // A hairline between rows, a stronger one above each GPU.
        let row_px = row_h as f64 * dpr;
        ctx.set_fill_style_str(if dark() { "rgba(0,0,0,0.45)" } else { "rgba(0,0,0,0.25)" });
        for (i, r) in rows.iter().enumerate().skip(1) {
            let y = i as f64 * row_px;
            let thick = if r.kind == "gpu" { 2.0 * dpr } else { 1.0 };
            ctx.fill_rect(0.0, y, w as f64, thick);
        }
        record_lags(canvas);
        Some(())
    }

    /// Notes samples taken in from the stream (their times), to be counted when next drawn.
    fn took_in(samples: &[Latest], since_ms: i64) {
        LAGS.with(|l| l.borrow_mut().0.extend(samples.iter().map(|s| s.sample.t).filter(|&t| t >= since_ms)));
    }

    /// After a drawing: the lag from each sample taken in to now, and the canvas's figures over the last ones.
    fn record_lags(canvas: &HtmlCanvasElement) {
        let now = js_sys::Date::now();
        LAGS.with(|l| {
            let (pending, kept) = &mut *l.borrow_mut();
            if pending.is_empty() {
                return;
            }
            for t in pending.drain(..) {
                if kept.len() >= LAGS_KEPT {
                    kept.pop_front();
                }
                kept.push_back(now - t as f64);
            }
            let mut sorted: Vec<f64> = kept.iter().copied().collect();
            sorted.sort_by(f64::total_cmp);
            let p = |q: f64| sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1];
            let _ = canvas.set_attribute("data-lag-p50", &format!("{:.0}", p(0.5)));
            let _ = canvas.set_attribute("data-lag-p95", &format!("{:.0}", p(0.95)));
            let _ = canvas.set_attribute("data-lag-n", &sorted.len().to_string());
        });
    }

    /// The per-cell baseline: one `fillRect` per cell.
    fn render_cells(canvas: &HtmlCanvasElement, h: &Heatmap) -> Option<()> {
        let rows = visible(h, &HashSet::new());
        let ctx = context(canvas)?;
        let (w, cw) = (canvas.width() as f64, canvas.width() as f64 / h.columns as f64);
        let row_px = canvas.height() as f64 / rows.len().max(1) as f64;
        ctx.clear_rect(0.0, 0.0, w, canvas.height() as f64);
        let max = scale_max(h, &rows);
        for (y, r) in rows.iter().enumerate() {
            for x in 0..h.columns {
                let c = super::colour(r.values.get(x).copied().flatten(), max, [200, 200, 200]);
                ctx.set_fill_style_str(&format!("rgb({},{},{})", c[0], c[1], c[2]));
                ctx.fill_rect(x as f64 * cw, y as f64 * row_px, cw.ceil(), row_px);
            }
        }
        Some(())
    }

    fn now() -> f64 {
        web_sys::window().and_then(|w| w.performance()).map_or(0.0, |p| p.now())
    }

    /// Finishes the canvas's pending work (a read-back waits for it), so that the time measured is the whole frame.
    fn flush(canvas: &HtmlCanvasElement) {
        if let Some(ctx) = context(canvas) {
            let _ = ctx.get_image_data(0.0, 0.0, 1.0, 1.0);
        }
    }

    fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        let p = |q: f64| v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
        (mean, p(0.5), p(0.95))
    }

    /// Frames of the live view (shift one column, add one, draw) against the per-cell baseline on the same data.
    fn bench(canvas: &HtmlCanvasElement, mut h: Heatmap) {
        let folded = HashSet::new();
        let all = 0..h.rows.len();
        render(canvas, &h, &folded, super::ROW_MIN, all.clone());
        let mut times = Vec::new();
        for f in 0..40 {
            let t0 = now();
            // The benchmark's heatmap is a synthetic fleet: its next second as the live stream would bring it.
            let samples = synthetic_tick(&h, f);
            h.apply(&samples);
            render(canvas, &h, &folded, super::ROW_MIN, all.clone());
            flush(canvas);
            times.push(now() - t0);
        }
        let mut base = Vec::new();
        for _ in 0..3 {
            let t0 = now();
            render_cells(canvas, &h);
            flush(canvas);
            base.push(now() - t0);
        }
        render(canvas, &h, &folded, super::ROW_MIN, all);
        let (mean, p50, p95) = stats(times);
        let (bmean, _, _) = stats(base);
        let text = format!(
            "{} rows × {} columns: frame mean {mean:.1} ms, p50 {p50:.1} ms, p95 {p95:.1} ms (40 frames: shift, add a column, draw); per-cell fillRect baseline {bmean:.1} ms ({:.1}× slower)",
            h.rows.len(),
            h.columns,
            bmean / mean.max(0.001)
        );
        if let Some(el) = web_sys::window()
            .and_then(|w| w.document())
            .and_then(|d| d.query_selector("[data-testid=bench]").ok().flatten())
        {
            el.set_text_content(Some(&text));
            for (k, v) in [("mean", mean), ("p50", p50), ("p95", p95), ("baseline", bmean)] {
                let _ = el.set_attribute(&format!("data-{k}"), &format!("{v:.3}"));
            }
        }
    }

    /// What the drawing side works on.
    pub struct Wiring {
        pub canvas: NodeRef<leptos::html::Canvas>,
        pub boxed: NodeRef<leptos::html::Div>,
        pub box_h: RwSignal<f64>,
        pub window: Memo<std::ops::Range<usize>>,
        pub live: RwSignal<Option<Heatmap>>,
        pub folded: RwSignal<HashSet<String>>,
        pub hover: RwSignal<Option<(String, i32, i32)>>,
        pub row_h: RwSignal<u32>,
        pub range: RwSignal<String>,
        pub view: Signal<super::View>,
        pub shown_group: RwSignal<Option<(String, bool)>>,
        pub counts: RwSignal<std::collections::HashMap<String, u32>>,
        pub benchmark: bool,
        pub synthetic: bool,
    }

    /// How many frames the canvas's drawing figures cover.
    const FRAMES_KEPT: usize = 120;

    thread_local! {
        /// How long the last frames took to draw (samples taken in included), ms.
        static FRAMES: std::cell::RefCell<std::collections::VecDeque<f64>> = const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
        /// How long taking in the synthetic fleet's samples took since the last frame (counted into the next one).
        static TAKEN: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
    }

    /// Counts a frame of `ms` into the canvas's figures.
    fn record_frame(canvas: &HtmlCanvasElement, ms: f64) {
        FRAMES.with(|f| {
            let mut f = f.borrow_mut();
            if f.len() >= FRAMES_KEPT {
                f.pop_front();
            }
            f.push_back(ms);
            let mut sorted: Vec<f64> = f.iter().copied().collect();
            sorted.sort_by(f64::total_cmp);
            let p = |q: f64| sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1];
            let _ = canvas.set_attribute("data-draw-p50", &format!("{:.2}", p(0.5)));
            let _ = canvas.set_attribute("data-draw-p95", &format!("{:.2}", p(0.95)));
            let _ = canvas.set_attribute("data-draw-max", &format!("{:.2}", p(1.0)));
            let _ = canvas.set_attribute("data-draw-n", &sorted.len().to_string());
        });
    }

    /// One second of a synthetic fleet's live stream: a sample for every GPU row at the column after the last.
    fn synthetic_tick(h: &Heatmap, tick: usize) -> Vec<Latest> {
        let t = h.from_ms + h.step_ms * h.columns as i64;
        h.rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.kind == "gpu")
            .map(|(i, r)| Latest {
                node_id: r.node_id.clone(),
                device: r.device.clone(),
                gpu: r.gpu_uuid.clone(),
                profile: None,
                start: None,
                sample: tessera_core::api::Sample {
                    t,
                    util: ((i * 7 + tick * 13) % 100) as f32,
                    mem_used_mib: 0.0,
                    mem_total_mib: 0.0,
                    power_w: None,
                    temp_c: None,
                },
            })
            .collect()
    }

    /// Draws whenever the data, folding or window size changes, follows the live stream in the live range, keeps
    /// who holds each row current, and explains the cell under the pointer.
    pub fn wire(w: Wiring) {
        let Wiring {
            canvas,
            boxed,
            box_h,
            window,
            live,
            folded,
            hover,
            row_h,
            range,
            view,
            shown_group,
            counts,
            benchmark,
            synthetic,
        } = w;
        let benched = StoredValue::new(false);
        let resized = RwSignal::new(0u32);
        if let Some(win) = web_sys::window() {
            let on_resize = Closure::<dyn FnMut()>::new(move || resized.update(|n| *n = n.wrapping_add(1)));
            let _ = win.add_event_listener_with_callback("resize", on_resize.as_ref().unchecked_ref());
            on_resize.forget();
        }
        Effect::new(move || {
            let Some(c) = canvas.get() else { return };
            let f = folded.get();
            resized.track();
            let t0 = now();
            live.with(|h| {
                let Some(h) = h else { return };
                if benchmark && !benched.get_value() {
                    benched.set_value(true);
                    bench(&c, h.clone());
                    return;
                }
                // Rows fill the space below the box's top when they fit; the box scrolls when they do not.
                let space = boxed.get_untracked().map_or_else(|| fitted_space(&c), |b| fitted_space(&b));
                let rh = super::row_height(space, visible(h, &f).len());
                if row_h.get_untracked() != rh {
                    row_h.set(rh);
                }
                let space = space.max(f64::from(super::ROW_MIN) * 8.0);
                if (box_h.get_untracked() - space).abs() >= 1.0 {
                    box_h.set(space);
                }
                render(&c, h, &f, rh, window.get());
            });
            let taken = TAKEN.with(|t| t.replace(0.0));
            // Measured, the canvas's pending work is finished too (a read-back waits for it); otherwise the browser
            // does it when it paints.
            if synthetic {
                flush(&c);
            }
            record_frame(&c, now() - t0 + taken);
        });

        // A synthetic fleet: a column of samples for every GPU every second, as the live stream would bring them.
        if synthetic {
            let tick = StoredValue::new(0usize);
            let handle = leptos::prelude::set_interval_with_handle(
                move || {
                    let t0 = now();
                    let n = tick.get_value();
                    tick.set_value(n + 1);
                    live.update(|h| {
                        if let Some(h) = h.as_mut() {
                            let samples = synthetic_tick(h, n);
                            h.apply(&samples);
                        }
                    });
                    TAKEN.with(|t| t.set(t.get() + (now() - t0)));
                },
                std::time::Duration::from_secs(1),
            );
            on_cleanup(move || {
                if let Ok(h) = handle {
                    h.clear();
                }
            });
        }

        // The event stream, while the live range is shown.
        let source = StoredValue::new_local(None::<web_sys::EventSource>);
        Effect::new(move || {
            let want = range.get() == "live" && !benchmark && !synthetic && shown_group.get().is_none();
            let v = view.get();
            if let Some(s) = source.get_value() {
                s.close();
                source.set_value(None);
            }
            if !want {
                return;
            }
            // The first event also brings the last 30 s, so nothing falls between the heatmap's fetch and the stream.
            let opened = js_sys::Date::now() as i64;
            let node =
                v.node.as_deref().map(|n| format!("&node={}", crate::pages::shared::encode(n))).unwrap_or_default();
            let Ok(es) = web_sys::EventSource::new(&format!("/api/v1/telemetry/live?since={}{node}", opened - 30_000))
            else {
                return;
            };
            // The stream has no model filter: one model's rows take only the samples of the rows they have.
            let one_model = v.model.is_some();
            let on_samples = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |ev: web_sys::MessageEvent| {
                let Some(text) = ev.data().as_string() else { return };
                let Ok(mut samples) = serde_json::from_str::<Vec<Latest>>(&text) else { return };
                let mut grew = false;
                live.update(|h| {
                    if let Some(h) = h.as_mut().filter(|h| h.source == "live") {
                        if one_model {
                            let rows: HashSet<&str> = h.rows.iter().map(|r| r.device.as_str()).collect();
                            samples.retain(|s| rows.contains(s.device.as_str()));
                        }
                        let before = h.rows.len();
                        h.apply(&samples);
                        grew = h.rows.len() > before;
                        took_in(&samples, opened);
                    }
                });
                // Rows first seen in the stream: who holds them comes from the heatmap API.
                if grew {
                    refresh_holders(live, view);
                }
            });
            let _ = es.add_event_listener_with_callback("samples", on_samples.as_ref().unchecked_ref());
            on_samples.forget();
            source.set_value(Some(es));
        });
        on_cleanup(move || {
            if let Some(s) = source.get_value() {
                s.close();
            }
        });
        // Slices granted or released on rows already shown: who holds them, every 15 s.
        if !benchmark && !synthetic {
            let handle = leptos::prelude::set_interval_with_handle(
                move || {
                    if range.get_untracked() == "live" && shown_group.get_untracked().is_none() {
                        refresh_holders(live, view);
                    }
                },
                std::time::Duration::from_secs(15),
            );
            on_cleanup(move || {
                if let Ok(h) = handle {
                    h.clear();
                }
            });
            // A grouped live heatmap: its last columns every 2 s (a group's mean needs every device's sample, which
            // the server has and the stream would bring one by one).
            let handle = leptos::prelude::set_interval_with_handle(
                move || {
                    if let Some((kind, _)) = shown_group.get_untracked().filter(|_| range.get_untracked() == "live") {
                        refresh_groups(live, view, counts, kind);
                    }
                },
                std::time::Duration::from_secs(2),
            );
            on_cleanup(move || {
                if let Ok(h) = handle {
                    h.clear();
                }
            });
        }

        // Hover: which row and column is under the pointer; the tooltip follows it.
        Effect::new(move || {
            let Some(c) = canvas.get() else { return };
            let on_move = Closure::<dyn FnMut(web_sys::MouseEvent)>::new(move |ev: web_sys::MouseEvent| {
                let (x, y) = (ev.offset_x() as f64, ev.offset_y() as f64);
                let text = live.with_untracked(|h| {
                    let h = h.as_ref()?;
                    let f = folded.get_untracked();
                    let rows = visible(h, &f);
                    let first = window.get_untracked().start;
                    let row = rows.get(first + (y / f64::from(row_h.get_untracked().max(1))) as usize)?;
                    let width = ev.target()?.dyn_into::<web_sys::Element>().ok()?.client_width().max(1) as f64;
                    let col = ((x / width) * h.columns as f64) as usize;
                    let at = h.from_ms + h.step_ms * col as i64;
                    let value = row.values.get(col).copied().flatten();
                    let when = js_sys::Date::new(&JsValue::from_f64(at as f64)).to_locale_time_string("en-GB");
                    let who = row
                        .allocations
                        .iter()
                        .map(|a| format!("{} ({})", a.tenant, crate::pages::shared::short(&a.allocation)))
                        .collect::<Vec<_>>();
                    Some(format!(
                        "{} · {} · {} · {}{}",
                        super::label(row),
                        row.device,
                        String::from(when),
                        value.map_or_else(|| "no sample".into(), |v| format!("{v:.1} {}", h.unit)),
                        if who.is_empty() { String::new() } else { format!(" · {}", who.join(", ")) }
                    ))
                });
                // Beside the pointer, on its left near the window's right edge.
                let vw = web_sys::window().and_then(|w| w.inner_width().ok()).and_then(|v| v.as_f64()).unwrap_or(1e9);
                let (cx, cy) = (ev.client_x(), ev.client_y());
                let left = if f64::from(cx) + 450.0 > vw { cx - 450 } else { cx };
                hover.set(text.map(|t| (t, left, cy)));
            });
            let _ = c.add_event_listener_with_callback("mousemove", on_move.as_ref().unchecked_ref());
            on_move.forget();
            let leave = Closure::<dyn FnMut()>::new(move || hover.set(None));
            let _ = c.add_event_listener_with_callback("mouseleave", leave.as_ref().unchecked_ref());
            leave.forget();
        });
    }

    /// Fetches the last columns of a grouped live heatmap (on its grid) and takes them in.
    fn refresh_groups(
        live: RwSignal<Option<Heatmap>>,
        view: Signal<super::View>,
        counts: RwSignal<std::collections::HashMap<String, u32>>,
        kind: String,
    ) {
        // From 10 s before the heatmap's own end (the server's clock, not the browser's), on its grid.
        let Some((from, step)) = live.with_untracked(|h| {
            h.as_ref().map(|h| {
                let step = h.step_ms.max(1);
                let back = (h.to_ms - 10_000 - h.from_ms).div_euclid(step).max(0);
                (h.from_ms + back * step, step)
            })
        }) else {
            return;
        };
        let asked = view.get_untracked();
        let v = super::View { range: "live".into(), group: Some(kind.clone()), ..asked.clone() };
        let path = format!("{}&from={from}&step={}", v.path(0), step / 1000);
        leptos::task::spawn_local(async move {
            if let Ok(mut tail) = crate::api::get_json::<Heatmap>(path).await {
                // The page moved on to other rows meanwhile: this answer is not theirs.
                if view.get_untracked() != asked {
                    return;
                }
                let fresh = super::grouped_rows(&mut tail, &kind);
                counts.update(|c| c.extend(fresh));
                live.update(|h| {
                    if let Some(h) = h.as_mut() {
                        h.merge(&tail);
                    }
                });
            }
        });
    }

    /// Fetches the live heatmap again and takes who holds each row (and the names of rows the stream added).
    fn refresh_holders(live: RwSignal<Option<Heatmap>>, view: Signal<super::View>) {
        if live.with_untracked(|h| h.is_none()) {
            return;
        }
        let v = super::View { range: "live".into(), ..view.get_untracked() };
        leptos::task::spawn_local(async move {
            let path = v.path(0);
            if let Ok(fresh) = crate::api::get_json::<Heatmap>(path).await {
                let changed = live.with_untracked(|h| {
                    h.as_ref().is_some_and(|h| {
                        let mut probe = h.clone();
                        probe.adopt(&fresh)
                    })
                });
                if changed {
                    live.update(|h| {
                        if let Some(h) = h.as_mut() {
                            h.adopt(&fresh);
                        }
                    });
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_api::telemetry::RowAllocation;

    fn sample(t: i64, util: f32) -> tessera_core::api::Sample {
        tessera_core::api::Sample { t, util, mem_used_mib: 10.0, mem_total_mib: 40.0, power_w: None, temp_c: None }
    }

    fn live(device: &str, gpu: &str, t: i64, util: f32) -> Latest {
        Latest {
            node_id: "n".into(),
            device: device.into(),
            gpu: gpu.into(),
            profile: device.starts_with("MIG").then(|| "1g.10gb".into()),
            start: device.starts_with("MIG").then_some(6),
            sample: sample(t, util),
        }
    }

    fn grouped(from_ms: i64, groups: &[(&str, &str, u32, Vec<Option<f32>>)]) -> Heatmap {
        let columns = groups.first().map_or(0, |g| g.3.len());
        Heatmap {
            metric: Metric::Util,
            unit: "%".into(),
            from_ms,
            to_ms: from_ms + 1000 * columns as i64,
            step_ms: 1000,
            columns,
            source: "live".into(),
            rows: vec![],
            groups: Some(
                groups
                    .iter()
                    .map(|(key, name, devices, values)| tessera_api::telemetry::HeatmapGroupRow {
                        key: key.to_string(),
                        name: name.to_string(),
                        devices: *devices,
                        values: values.clone(),
                    })
                    .collect(),
            ),
        }
    }

    #[test]
    fn groups_are_drawn_as_rows_that_link_to_their_devices_and_stay_live_from_later_columns() {
        let mut h = grouped(
            10_000,
            &[("n1", "rack-1", 8, vec![Some(10.0), None, Some(30.0)]), ("n2", "rack-2", 4, vec![None; 3])],
        );
        let counts = grouped_rows(&mut h, "node");
        assert_eq!(counts.get("n1"), Some(&8));
        assert!(h.groups.is_none() && h.rows.len() == 2 && h.rows.iter().all(is_group));
        assert_eq!((label(&h.rows[0]), h.rows[0].device.as_str()), ("rack-1".to_string(), "n1"));
        // Groups are never folded away, whatever was folded before.
        let folded: std::collections::HashSet<String> = ["n1".to_string()].into();
        assert_eq!(visible(&h, &folded).len(), 2);
        // A node's row opens its devices, a model's its nodes; the model narrowing a view is kept.
        let view = View {
            range: "live".into(),
            metric: "util".into(),
            group: Some("node".into()),
            node: None,
            model: Some("H100 80GB".into()),
        };
        assert_eq!(view.drill(&h.rows[0]), "/heatmap?node=rack-1&model=H100%2080GB");
        assert_eq!(view.path(0), "/api/v1/telemetry/heatmap?metric=util&group=node&model=H100%2080GB");
        let day = View { range: "day".into(), ..view.clone() };
        assert_eq!(
            day.path(86_400_000),
            "/api/v1/telemetry/heatmap?metric=util&from=0&step=600&group=node&model=H100%2080GB"
        );
        let mut by_model = grouped(0, &[("A30", "A30", 2, vec![None])]);
        grouped_rows(&mut by_model, "model");
        assert_eq!(view.drill(&by_model.rows[0]), "/heatmap?group=node&model=A30");

        // Later columns on the same grid: the window moves on and their values land; a new group is added.
        let mut tail = grouped(
            12_000,
            &[("n2", "rack-2", 4, vec![Some(50.0), Some(60.0)]), ("n3", "rack-3", 8, vec![None, Some(5.0)])],
        );
        grouped_rows(&mut tail, "node");
        assert!(h.merge(&tail));
        assert_eq!((h.from_ms, h.to_ms), (11_000, 14_000));
        assert_eq!(h.rows[0].values, [None, Some(30.0), None], "rack-1's columns moved left");
        assert_eq!(h.rows[1].values, [None, Some(50.0), Some(60.0)]);
        assert_eq!((h.rows[2].device.as_str(), h.rows[2].values.clone()), ("n3", vec![None, None, Some(5.0)]));
        assert!(!h.merge(&tail), "the same columns again change nothing");
        // Columns off the grid are not taken.
        let mut off = grouped(12_500, &[("n1", "rack-1", 8, vec![Some(99.0)])]);
        grouped_rows(&mut off, "node");
        assert!(!h.merge(&off));
    }

    #[test]
    fn live_samples_move_the_window_and_land_in_their_column() {
        let mut h = synthetic("2x4");
        h.rows[0].gpu_uuid = "GPU-0".into();
        // Columns cover [0, 4000); a sample at 5500 moves the window by two columns.
        assert!(h.apply(&[live("GPU-0", "GPU-0", 5500, 42.0)]));
        assert_eq!((h.from_ms, h.to_ms), (2000, 6000));
        assert_eq!(h.rows[0].values.len(), 4);
        assert_eq!(h.rows[0].values[3], Some(42.0));
        assert_eq!(h.rows[1].values[3], None);
        // A new MIG instance gets its row right after its GPU's.
        h.apply(&[live("MIG-a", "GPU-0", 5600, 7.0)]);
        assert_eq!(h.rows[1].device, "MIG-a");
        assert_eq!(label(&h.rows[1]), "bench-node-0 · GPU 0 · 1g.10gb@6");
        assert_eq!(h.rows[1].values[3], Some(7.0));
        // A sample older than the window is dropped.
        assert!(!h.apply(&[live("GPU-0", "GPU-0", 100, 1.0)]));
        // Who holds the new row comes from a fresh fetch; its values stay.
        let mut fresh = h.clone();
        fresh.rows[1].allocations = vec![RowAllocation { allocation: "a1".into(), tenant: "vision".into() }];
        fresh.rows[1].values = vec![None; 4];
        assert!(h.adopt(&fresh));
        assert_eq!(h.rows[1].allocations[0].tenant, "vision");
        assert_eq!(h.rows[1].values[3], Some(7.0));
        assert!(!h.adopt(&fresh));
    }

    #[test]
    fn a_row_says_who_runs_on_it_and_marks_unallocated_use_and_a_refresh_brings_both() {
        let mut h = synthetic("2x4");
        let mut fresh = h.clone();
        let row = &mut fresh.rows[0];
        row.processes = vec![
            tessera_api::telemetry::RowProcess {
                pid: 7,
                user: Some("ann".into()),
                command: Some("python3".into()),
                pod: None,
                allocation: "a1".into(),
            },
            tessera_api::telemetry::RowProcess {
                pid: 9,
                user: None,
                command: None,
                pod: Some(tessera_core::attribution::PodRef {
                    namespace: "ml-a".into(),
                    pod: "train-0".into(),
                    container: "main".into(),
                }),
                allocation: "a1".into(),
            },
        ];
        row.unallocated = 2;
        assert_eq!(runs_text(&h.rows[0]), "");
        assert_eq!(unallocated_text(&h.rows[0]), None);
        assert!(h.adopt(&fresh), "a refresh brings who runs and the unallocated use");
        assert_eq!(runs_text(&h.rows[0]), "python3 of ann, pid 7; pod ml-a/train-0 (container main), pid 9");
        assert_eq!(unallocated_text(&h.rows[0]).as_deref(), Some("2 processes use this device without an allocation"));
        h.rows[0].unallocated = 1;
        assert_eq!(unallocated_text(&h.rows[0]).as_deref(), Some("1 process uses this device without an allocation"));
    }

    #[test]
    fn health_changes_are_marked_at_their_time_on_visible_gpu_rows_and_adopted_on_refresh() {
        use tessera_api::telemetry::HealthMark;
        use tessera_core::health::HealthState;
        let mut h = synthetic("2x1");
        let (from, to) = (h.from_ms, h.to_ms);
        let mark = |at_ms: i64, state: HealthState, codes: &[&str]| HealthMark {
            at_ms,
            state,
            codes: codes.iter().map(|c| c.to_string()).collect(),
        };
        let mut fresh = h.clone();
        let span = to - from;
        let gpu1 = fresh.rows.iter().position(|r| r.kind == "gpu" && r.gpu_uuid == "GPU-1").expect("GPU-1");
        fresh.rows[gpu1].health = Some(HealthState::Unhealthy);
        fresh.rows[gpu1].health_marks = vec![
            mark(from - 1, HealthState::Degraded, &[]),
            mark(from + span / 4, HealthState::Unhealthy, &["xid_79"]),
        ];
        // A refresh brings the GPU's health and its changes.
        assert!(h.adopt(&fresh));
        assert!(!h.adopt(&fresh), "nothing new the second time");
        let rows = visible(&h, &Default::default());
        let m = markers(&h, &rows);
        assert_eq!(m.len(), 1, "a change before the range is not drawn: {m:?}");
        let row = rows.iter().position(|r| r.device == h.rows[gpu1].device).expect("row");
        assert_eq!((m[0].row, m[0].state, m[0].x), (row, "unhealthy", 0.25));
        assert!(m[0].title.contains("xid_79") && m[0].title.contains("unhealthy"), "{}", m[0].title);
        // Folding other GPUs moves the row up; the marker follows it.
        let folded = std::collections::HashSet::from(["GPU-0".to_string()]);
        let rows = visible(&h, &folded);
        let row = rows.iter().position(|r| r.device == h.rows[gpu1].device).expect("row");
        assert_eq!(markers(&h, &rows)[0].row, row);
    }

    #[test]
    fn memory_is_shown_as_a_share_and_folded_gpus_hide_their_instances() {
        let mut h = synthetic("1x2");
        h.metric = Metric::MemPct;
        assert_eq!(h.value_of(&sample(0, 5.0)), Some(25.0));
        assert_eq!(metric_name(h.metric), "mem_pct");
        h.apply(&[live("MIG-a", "GPU-0", 1500, 7.0)]);
        let folded = std::collections::HashSet::from(["GPU-0".to_string()]);
        assert_eq!(visible(&h, &folded).len(), 1);
        assert_eq!(visible(&h, &Default::default()).len(), 2);
    }

    #[test]
    fn several_samples_of_a_device_in_one_event_each_fill_their_column() {
        let mut h = synthetic("1x10");
        h.rows[0].values = vec![None; 10];
        let batch: Vec<Latest> = (6..10).map(|s| live("GPU-0", "GPU-0", s * 1000 + 400, s as f32)).collect();
        assert!(h.apply(&batch));
        assert_eq!(h.rows[0].values[5], None);
        assert_eq!(&h.rows[0].values[6..], &[Some(6.0), Some(7.0), Some(8.0), Some(9.0)]);
    }

    #[test]
    fn rows_fill_the_space_within_bounds_and_the_axis_has_round_ticks() {
        assert_eq!(row_height(800.0, 10), ROW_MAX);
        assert_eq!(row_height(800.0, 40), 20);
        assert_eq!(row_height(800.0, 400), ROW_MIN);
        assert_eq!(row_height(-5.0, 0), ROW_MIN);
        // 15 minutes: a tick every 2 minutes, on the minute.
        let t = ticks(60_000 * 1000 + 30_000, 60_000 * 1015 + 30_000, 8);
        assert_eq!(t.len(), 7);
        assert!(t.iter().all(|(x, ms)| *ms % 120_000 == 0 && (0.0..1.0).contains(x)));
        // 24 hours: every 6 hours (3-hour steps would give 8, one more than fits below 8).
        let day = ticks(0, 86_400_000, 8);
        assert_eq!(day.iter().map(|(_, ms)| ms / 3_600_000).collect::<Vec<_>>(), [6, 12, 18]);
    }

    #[test]
    fn colours_run_from_purple_to_yellow_and_gaps_are_neutral() {
        assert_eq!(colour(Some(0.0), 100.0, [1, 2, 3]), [68, 1, 84]);
        assert_eq!(colour(Some(100.0), 100.0, [1, 2, 3]), [253, 231, 37]);
        assert_eq!(colour(Some(250.0), 100.0, [1, 2, 3]), [253, 231, 37]);
        assert_eq!(colour(None, 100.0, [1, 2, 3]), [1, 2, 3]);
        let rows = synthetic("3x5");
        let refs: Vec<&HeatmapRow> = rows.rows.iter().collect();
        assert_eq!(pixels(&refs, 5, 100.0, [0, 0, 0]).len(), 3 * 5 * 4);
    }
}
