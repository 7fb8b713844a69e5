//! Where an [`Admission`](crate::Admission)'s room comes from: no limit,
//! a budget of this process alone, or a limit the processes of a container
//! share through a ledger (`ledger.rs`), less what the rest of the group
//! holds, as sampled.

use crate::ledger::{Ledger, Others};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tensor_arena::Budget;

/// Where the room comes from.
pub(crate) enum Room {
    /// No limit: every run is admitted at once (and counted).
    Unlimited,
    /// A budget of this process alone: its limit.
    Budget(Arc<Budget>),
    /// A limit shared by the processes of a container through a ledger.
    Shared(Shared),
}

/// A limit shared through a [`Ledger`].
pub(crate) struct Shared {
    /// The process's budget: its limit is set to this process's room.
    pub(crate) budget: Arc<Budget>,
    pub(crate) ledger: Ledger,
    /// The container's limit in bytes.
    pub(crate) limit: usize,
    /// Whether the limit is the container's whole memory (the rest of
    /// every process and [`Shared::margin`] come off it), or one the
    /// program set for the arenas alone.
    pub(crate) whole: bool,
    /// What is kept free under a whole limit: the kernel's own memory
    /// charged to the group, and what processes allocate between samples.
    pub(crate) margin: usize,
    /// The group's usage files, for a whole limit: what the group holds
    /// (`memory.current`, v1's `memory.usage_in_bytes`) and its
    /// `memory.stat` (page cache the kernel can drop: `inactive_file`).
    /// `None`: the processes' own figures are summed instead.
    pub(crate) usage: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// How long a sample of the group's rest counts: the rest a service's
/// requests hold outside the arenas (decoded images, preprocessing) comes
/// and goes with them, and the room follows its recent peak, not a dip.
pub const REST_WINDOW: Duration = Duration::from_secs(10);

/// The rest of a group (all it holds but the arenas), as sampled.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupRest {
    pub(crate) now: usize,
    /// The most over [`REST_WINDOW`]: what runs beside others are
    /// admitted against (the rest comes and goes with requests).
    pub(crate) peak: usize,
    /// The least over [`REST_WINDOW`]: what a run alone could have once
    /// the other requests' buffers are gone; a run that needs more than
    /// that is refused at once.
    pub(crate) floor: usize,
}

/// Which figure of the group's rest a room is taken with.
#[derive(Clone, Copy)]
pub(crate) enum RestBy {
    Peak,
    Now,
    Floor,
}

/// What a shared limit's room was last read from.
#[derive(Default)]
pub(crate) struct Reading {
    /// The room, and when it was read.
    pub(crate) room: Option<(usize, Instant)>,
    /// The other processes, as last read.
    pub(crate) others: Others,
    /// The rest of this process (its anonymous memory outside arenas).
    pub(crate) rest: usize,
    /// The rest of the whole group (all it holds but the arenas), where
    /// its usage can be read: the most seen over [`REST_WINDOW`].
    pub(crate) group_rest: Option<GroupRest>,
    /// The group's rest as sampled over the last [`REST_WINDOW`].
    pub(crate) rest_seen: VecDeque<(Instant, usize)>,
}

impl Reading {
    /// Reads the figures of `s` again: this process's rest, the other
    /// processes' shares and the group's usage. Returns the room for this
    /// process's runs together (its budget's limit is set to it).
    pub(crate) fn read(&mut self, s: &Shared, promised: usize) -> usize {
        let committed = s.budget.committed();
        self.rest = crate::ledger::anon_resident()
            .and_then(|a| usize::try_from(a).ok())
            .map_or(0, |a| a.saturating_sub(committed));
        self.others = s.ledger.others(false);
        // Under a whole limit with the group's own figures: the rest is
        // everything the group holds but the arenas (processes that are
        // not ours, the kernel's memory, page cache in use).
        let others_committed = usize::try_from(self.others.committed).unwrap_or(usize::MAX);
        self.group_rest = s
            .usage
            .as_ref()
            .filter(|_| s.whole)
            .and_then(|(u, stat)| working_set(u, stat))
            .map(|ws| ws.saturating_sub(others_committed.saturating_add(committed)))
            .map(|now| recent(&mut self.rest_seen, now));
        let room = self
            .base(s, RestBy::Peak)
            .saturating_sub(self.others_held());
        // This process's commits must fit in its room too (idle workers
        // give back first; a commit that still does not fit is refused).
        s.budget.set_limit(room);
        if committed > room || (self.others.alone && committed > promised) {
            // The rest of the group grew into what the arenas hold, or
            // another process waits to run (or runs) a run alone: idle
            // workers give their cache back now, not at their next commit
            // or their idle decay.
            s.budget.relieve();
        }
        self.room = Some((room, Instant::now()));
        room
    }

    /// What the other processes' arenas need.
    pub(crate) fn others_held(&self) -> usize {
        usize::try_from(self.others.held).unwrap_or(usize::MAX)
    }

    /// What a shared limit leaves this process's runs before the other
    /// processes' arenas: the limit, less (for a whole limit) the margin
    /// and the rest of the group taken `by` one of its figures.
    pub(crate) fn base(&self, s: &Shared, by: RestBy) -> usize {
        if !s.whole {
            return s.limit;
        }
        let others_rest = usize::try_from(self.others.rest).unwrap_or(usize::MAX);
        let measured = match (self.group_rest, by) {
            (Some(g), RestBy::Peak) => g.peak,
            (Some(g), RestBy::Now) => g.now,
            (Some(g), RestBy::Floor) => g.floor,
            (None, _) => self.rest.saturating_add(others_rest),
        };
        s.limit.saturating_sub(s.margin).saturating_sub(measured)
    }
}

/// Adds `now` to the samples and returns the group's rest now, its most
/// and its least within [`REST_WINDOW`].
fn recent(seen: &mut VecDeque<(Instant, usize)>, now: usize) -> GroupRest {
    let t = Instant::now();
    while seen
        .front()
        .is_some_and(|(at, _)| t.duration_since(*at) > REST_WINDOW)
    {
        seen.pop_front();
    }
    // Samples at most every REFRESH: a few hundred at most.
    seen.push_back((t, now));
    let values = seen.iter().map(|(_, v)| *v);
    GroupRest {
        now,
        peak: values.clone().max().unwrap_or(now),
        floor: values.min().unwrap_or(now),
    }
}

/// What a group holds that the kernel cannot simply drop: its usage less
/// its page cache, from its usage file and `memory.stat`. The margin
/// ([`crate::margin`]) covers the cache a service cannot do without (the
/// code it runs).
pub(crate) fn working_set(usage: &std::path::Path, stat: &std::path::Path) -> Option<usize> {
    let used: usize = std::fs::read_to_string(usage).ok()?.trim().parse().ok()?;
    let stat = std::fs::read_to_string(stat).unwrap_or_default();
    let field = |name: &str| {
        stat.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse::<usize>().ok())?
        })
    };
    // Page cache the kernel reclaims before it kills (active or not; tmpfs
    // and shared memory are on the anonymous lists, not here): v1's
    // hierarchical figures where there are some, else the group's own.
    let file = |name: &str| field(&format!("total_{name}")).or_else(|| field(name));
    let cache = file("inactive_file")
        .unwrap_or(0)
        .saturating_add(file("active_file").unwrap_or(0));
    Some(used.saturating_sub(cache))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_working_set_is_its_usage_less_inactive_page_cache() {
        let d = tempfile::tempdir().unwrap();
        let (usage, stat) = (
            d.path().join("memory.current"),
            d.path().join("memory.stat"),
        );
        std::fs::write(&usage, "1000000\n").unwrap();
        std::fs::write(&stat, "anon 5\ninactive_file 300000\nactive_file 7\n").unwrap();
        assert_eq!(working_set(&usage, &stat), Some(699_993));
        // v1: the hierarchical figures win.
        std::fs::write(
            &stat,
            "inactive_file 1\nactive_file 2\ntotal_inactive_file 400000\ntotal_active_file 100000\n",
        )
        .unwrap();
        assert_eq!(working_set(&usage, &stat), Some(500_000));
        assert_eq!(working_set(&d.path().join("none"), &stat), None);
    }
}
