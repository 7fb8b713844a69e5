//! Merging what a process learned with what its store's file already
//! holds (other replicas' learning), and the bounds every saved or loaded
//! store is cut to.
//!
//! Conflicts: a key planned on both sides keeps this process's plan (the
//! newer learning, already served here); a shape (dimensions) seen on both
//! sides keeps this process's sizes; a structure's alignments are the
//! larger of both sides'. Everything else is the union, the file's part
//! counted as older, cut to the bounds below with the oldest out.

use super::snapshot::{FamilySnapshot, StructureSnapshot};
use crate::plan::Plan;
use std::collections::HashSet;
use std::sync::Arc;

/// Plans a store file's decoding keeps (the most recent): more than any
/// cache holds.
pub(crate) const MAX_PLANS: usize = 4096;
/// Families a store keeps (the most recent).
pub(crate) const MAX_FAMILIES: usize = 128;
/// Structures kept per family (the most recent).
pub(crate) const MAX_STRUCTURES: usize = 8;
/// Shapes kept per structure (the most recent).
pub(crate) const MAX_SHAPES: usize = 16;

/// The plans of both sides by encoded key, the file's first (older) and
/// this process's last, a key on both sides kept as this process's; the
/// most recent `cap` kept.
pub(crate) fn plans(
    disk: Vec<(Vec<u8>, Plan)>,
    ours: Vec<(Vec<u8>, Arc<Plan>)>,
    cap: usize,
) -> Vec<(Vec<u8>, Arc<Plan>)> {
    let mine: HashSet<&[u8]> = ours.iter().map(|(k, _)| k.as_slice()).collect();
    let older: Vec<(Vec<u8>, Arc<Plan>)> = disk
        .into_iter()
        .filter(|(k, _)| !mine.contains(k.as_slice()))
        .map(|(k, p)| (k, Arc::new(p)))
        .collect();
    let mut all = older;
    all.extend(ours);
    let excess = all.len().saturating_sub(cap.max(1));
    all.drain(..excess);
    all
}

/// The families of both sides, merged by id (the file's older), then cut
/// to the bounds.
pub(crate) fn families(
    disk: Vec<FamilySnapshot>,
    ours: Vec<FamilySnapshot>,
) -> Vec<FamilySnapshot> {
    let mut disk = disk;
    let mut out: Vec<FamilySnapshot> = Vec::new();
    let mine: HashSet<u64> = ours.iter().map(|f| f.id).collect();
    out.extend(disk.iter().filter(|f| !mine.contains(&f.id)).cloned());
    for f in ours {
        match disk.iter_mut().find(|d| d.id == f.id) {
            Some(d) => {
                let older = std::mem::take(&mut d.structures);
                out.push(FamilySnapshot {
                    id: f.id,
                    name: f.name,
                    structures: structures(older, f.structures),
                });
            }
            None => out.push(f),
        }
    }
    bound(out)
}

fn structures(
    disk: Vec<StructureSnapshot>,
    ours: Vec<StructureSnapshot>,
) -> Vec<StructureSnapshot> {
    let mut disk = disk;
    let mut out: Vec<StructureSnapshot> = disk
        .iter()
        .filter(|d| !ours.iter().any(|o| o.events == d.events))
        .cloned()
        .collect();
    for s in ours {
        match disk.iter_mut().find(|d| d.events == s.events) {
            Some(d) if d.aligns.len() == s.aligns.len() => {
                let aligns = d
                    .aligns
                    .iter()
                    .zip(&s.aligns)
                    .map(|(a, b)| (*a).max(*b))
                    .collect();
                let mut shapes: Vec<_> = std::mem::take(&mut d.shapes)
                    .into_iter()
                    .filter(|o| !s.shapes.iter().any(|m| m.dims == o.dims))
                    .collect();
                shapes.extend(s.shapes);
                out.push(StructureSnapshot {
                    events: s.events,
                    aligns,
                    shapes,
                });
            }
            _ => out.push(s),
        }
    }
    out
}

/// Cuts families to [`MAX_FAMILIES`], their structures to
/// [`MAX_STRUCTURES`] and their shapes to [`MAX_SHAPES`], keeping the most
/// recent (the last) of each; drops structures with no shape and families
/// with no structure.
pub(crate) fn bound(mut families: Vec<FamilySnapshot>) -> Vec<FamilySnapshot> {
    for f in &mut families {
        for s in &mut f.structures {
            let excess = s.shapes.len().saturating_sub(MAX_SHAPES);
            s.shapes.drain(..excess);
        }
        f.structures.retain(|s| !s.shapes.is_empty());
        let excess = f.structures.len().saturating_sub(MAX_STRUCTURES);
        f.structures.drain(..excess);
    }
    families.retain(|f| !f.structures.is_empty());
    let excess = families.len().saturating_sub(MAX_FAMILIES);
    families.drain(..excess);
    families
}

/// Whether the file's side (`disk`) already holds everything of ours it
/// has room for: every plan's key (unless the file holds `cap` plans),
/// and every family's shapes by dimensions (unless the family, or the
/// file's families, are full). A save that finds this writes nothing.
pub(crate) fn holds(
    disk_plans: &[(Vec<u8>, Plan)],
    disk_families: &[FamilySnapshot],
    ours: &[(Vec<u8>, Arc<Plan>)],
    our_families: &[FamilySnapshot],
    cap: usize,
) -> bool {
    let keys: HashSet<&[u8]> = disk_plans.iter().map(|(k, _)| k.as_slice()).collect();
    let plans_held =
        disk_plans.len() >= cap.max(1) || ours.iter().all(|(k, _)| keys.contains(k.as_slice()));
    plans_held
        && our_families
            .iter()
            .all(|f| match disk_families.iter().find(|d| d.id == f.id) {
                None => disk_families.len() >= MAX_FAMILIES,
                Some(d) => f.structures.iter().all(|s| {
                    match d.structures.iter().find(|ds| ds.events == s.events) {
                        None => d.structures.len() >= MAX_STRUCTURES,
                        Some(ds) => {
                            ds.shapes.len() >= MAX_SHAPES
                                || s.shapes
                                    .iter()
                                    .all(|sh| ds.shapes.iter().any(|o| o.dims == sh.dims))
                        }
                    }
                }),
            })
}
