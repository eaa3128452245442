//! One GPU drawn as its MIG placement units, instances where they sit (the catalog's placements, not a count).

use leptos::prelude::*;
use tessera_core::catalog::Catalog;
use tessera_core::layout::PlacedInstance;

/// How an instance is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Stays as it is.
    Kept,
    /// Created by the change.
    Created,
    /// Destroyed by the change.
    Destroyed,
    /// Has processes or an allocation: it cannot be moved.
    Locked,
}

impl Mark {
    fn class(self) -> &'static str {
        match self {
            Mark::Kept => "kept",
            Mark::Created => "created",
            Mark::Destroyed => "destroyed",
            Mark::Locked => "locked",
        }
    }
}

/// `(first unit, width)` of `inst` on `model` per the catalog; `None` for a profile or start the model lacks.
pub fn span(model: &str, inst: &PlacedInstance) -> Option<(u8, u8)> {
    let m = Catalog::builtin().resolve(model)?.0;
    let p = m.profile(&inst.profile)?.placement_at(inst.start)?;
    Some((p.start, p.size))
}

/// Units of `model` (8 on most, more on some).
pub fn units(model: &str) -> u8 {
    Catalog::builtin().resolve(model).map_or(8, |(m, _)| m.placement_units_total)
}

/// A row of the GPU's units with `instances` drawn on it.
pub fn slot_row(model: &str, label: &str, instances: Vec<(PlacedInstance, Mark)>) -> AnyView {
    let n = units(model);
    let model = model.to_string();
    let described =
        instances.iter().map(|(i, m)| format!("{}@{} {}", i.profile, i.start, m.class())).collect::<Vec<_>>();
    view! {
        <div class="slots" style=format!("--units:{n}") role="img" aria-label=format!("{label}: {}", described.join(", "))>
            <span class="slots-label">{label.to_string()}</span>
            {(0..n).map(|u| view! { <span class="unit" style=format!("grid-column:{}", u + 2)></span> }).collect_view()}
            {instances.into_iter().filter_map(|(i, mark)| {
                let (start, size) = span(&model, &i)?;
                Some(view! {
                    <span class=format!("inst {}", mark.class()) data-profile=i.profile.clone() data-start=i.start
                        style=format!("grid-column:{} / span {}", start + 2, size)>
                        {i.profile.clone()}<small>{format!("@{}", i.start)}</small>
                    </span>
                })
            }).collect_view()}
        </div>
    }
    .into_any()
}

/// The layout before and after a change: destroyed instances on the first row, created ones on the second.
pub fn diff_view(
    model: &str,
    layout: &[PlacedInstance],
    created: &[PlacedInstance],
    destroyed: &[PlacedInstance],
) -> AnyView {
    let kept: Vec<PlacedInstance> = layout.iter().filter(|i| !created.contains(i)).cloned().collect();
    let before =
        kept.iter().map(|i| (i.clone(), Mark::Kept)).chain(destroyed.iter().map(|i| (i.clone(), Mark::Destroyed)));
    let after = kept.iter().map(|i| (i.clone(), Mark::Kept)).chain(created.iter().map(|i| (i.clone(), Mark::Created)));
    view! {
        <div class="diff">
            {slot_row(model, "now", before.collect())}
            {slot_row(model, "after", after.collect())}
            <p class="small muted">
                {format!("{} kept · ", kept.len())}
                <span class="created-text">{format!("{} created", created.len())}</span>" · "
                <span class="destroyed-text">{format!("{} destroyed", destroyed.len())}</span>
            </p>
        </div>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_come_from_the_catalog_placements() {
        let i = |p: &str, s: u8| PlacedInstance { profile: p.into(), start: s };
        assert_eq!(span("H100-80GB", &i("3g.40gb", 4)), Some((4, 4)));
        assert_eq!(span("H100-80GB", &i("1g.10gb", 6)), Some((6, 1)));
        assert_eq!(span("H100-80GB", &i("3g.40gb", 1)), None, "3g.40gb cannot start at 1");
        assert_eq!(units("H100-80GB"), 8);
    }
}
