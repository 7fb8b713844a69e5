//! The system's transparent huge page settings, and what [`Pages`] asks
//! of them when it commits: the huge-page half of the commit policy
//! (`docs/decisions.md`, "Huge pages without the stall").
//!
//! [`Pages`]: super::Pages

use super::HugePages;

/// THP's `enabled` setting (`/sys/kernel/mm/transparent_hugepage/enabled`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Enabled {
    /// Every anonymous mapping may get huge pages.
    Always,
    /// Only ranges advised `MADV_HUGEPAGE`.
    Madvise,
    /// None.
    Never,
}

/// THP's `defrag` setting: what a fault does when it finds no free huge
/// page (`Documentation/admin-guide/mm/transhuge.rst`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Defrag {
    /// Every THP fault compacts directly, on the faulting thread.
    Always,
    /// Advised ranges compact directly; others wake kswapd/kcompactd.
    DeferMadvise,
    /// Advised ranges compact directly; others take a base page.
    Madvise,
    /// No fault compacts; kswapd/kcompactd are woken.
    Defer,
    /// No fault compacts.
    Never,
}

/// The settings `Pages` follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// The huge page size (`hpage_pmd_size`), a power of two.
    pub size: usize,
    /// `enabled`.
    pub enabled: Enabled,
    /// `defrag`.
    pub defrag: Defrag,
}

/// The bracketed word of a sysfs setting (`always [madvise] never`).
fn selected(text: &str) -> Option<&str> {
    text.split('[').nth(1)?.split(']').next()
}

impl Settings {
    /// The settings from the texts of `enabled`, `defrag` and
    /// `hpage_pmd_size`; `None` when they cannot be read as such. An
    /// unknown `defrag` is taken as `always` (it may compact).
    pub(crate) fn parse(enabled: &str, defrag: &str, size: Option<&str>) -> Option<Self> {
        let enabled = match selected(enabled)? {
            "always" => Enabled::Always,
            "madvise" => Enabled::Madvise,
            "never" => Enabled::Never,
            _ => return None,
        };
        let defrag = match selected(defrag).unwrap_or("") {
            "defer+madvise" => Defrag::DeferMadvise,
            "madvise" => Defrag::Madvise,
            "defer" => Defrag::Defer,
            "never" => Defrag::Never,
            _ => Defrag::Always,
        };
        let size = size
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(2 << 20);
        size.is_power_of_two().then_some(Self {
            size,
            enabled,
            defrag,
        })
    }

    /// This system's settings, or `None` without transparent huge pages.
    pub(crate) fn read() -> Option<Self> {
        let dir = "/sys/kernel/mm/transparent_hugepage";
        let enabled = std::fs::read_to_string(format!("{dir}/enabled")).ok()?;
        let defrag = std::fs::read_to_string(format!("{dir}/defrag")).unwrap_or_default();
        let size = std::fs::read_to_string(format!("{dir}/hpage_pmd_size")).ok();
        Self::parse(&enabled, &defrag, size.as_deref())
    }
}

/// How `Pages` asks for huge pages when it commits a range that holds a
/// whole huge page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    /// Base pages only: no advice.
    Off,
    /// Each such range is advised `MADV_HUGEPAGE` before it is populated.
    Advise,
    /// No advice: the system gives huge pages to memory that is not
    /// advised, and such a fault never compacts directly.
    Unadvised,
    /// A fault that finds no free huge page compacts directly here, so only
    /// as many of the range's huge pages as the kernel has free are
    /// advised ([`huge_pages_to_take`]); the rest is kept from huge pages
    /// (`MADV_NOHUGEPAGE`) while it is populated, then advised, so that
    /// khugepaged, the kernel's own thread, may collapse it later.
    WhereFree,
}

/// What `Pages` does for `mode` on a system with `thp` (`None`: no THP).
/// The table is in `docs/decisions.md`, "Huge pages without the stall".
pub(crate) fn policy(mode: HugePages, thp: Option<Settings>) -> Policy {
    let Some(thp) = thp else {
        return Policy::Off;
    };
    match (mode, thp.enabled, thp.defrag) {
        (HugePages::Never, ..) | (_, Enabled::Never, _) => Policy::Off,
        (HugePages::Advise, ..) => Policy::Advise,
        // Advice is needed, and no fault compacts.
        (HugePages::Auto, Enabled::Madvise, Defrag::Defer | Defrag::Never) => Policy::Advise,
        // Advice is needed, and an advised fault compacts.
        (HugePages::Auto, Enabled::Madvise, _) => Policy::WhereFree,
        // Every fault compacts, advised or not.
        (HugePages::Auto, Enabled::Always, Defrag::Always) => Policy::WhereFree,
        // Huge pages without advice, and a fault without advice never
        // compacts (advice would make it).
        (HugePages::Auto, Enabled::Always, _) => Policy::Unadvised,
    }
}

/// Free huge pages a commit leaves to others: a margin for other
/// allocations and the zones' watermarks.
const MARGIN: usize = 16;

/// How many of the `need` huge pages of a commit to ask for when the
/// kernel has `free` free huge pages (`None`: unknown, none): at most half
/// of those past [`MARGIN`] (others allocate too, the reading may be
/// stale, and a zone below its watermark takes the slow path, which
/// compacts).
pub(crate) fn huge_pages_to_take(free: Option<usize>, need: usize) -> usize {
    free.map_or(0, |f| (f.saturating_sub(MARGIN) / 2).min(need))
}

/// Free blocks of `order` or more (counted in blocks of `order`) in
/// `/proc/buddyinfo`'s text, over the zones user memory comes from (all
/// but `DMA`).
pub(crate) fn parse_buddyinfo(text: &str, order: usize) -> usize {
    let mut total = 0usize;
    for line in text.lines() {
        // "Node 0, zone   Normal   34  744 ..."
        let Some((_, rest)) = line.split_once("zone") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        if words.next().is_none_or(|zone| zone == "DMA") {
            continue;
        }
        for (k, count) in words.enumerate() {
            let Ok(count) = count.parse::<usize>() else {
                continue;
            };
            if k >= order {
                let blocks =
                    count.saturating_mul(1usize.checked_shl((k - order) as u32).unwrap_or(0));
                total = total.saturating_add(blocks);
            }
        }
    }
    total
}

/// Free huge pages of `huge` bytes (pages of `page` bytes) the kernel has
/// now without compaction (`/proc/buddyinfo`), or `None` if unreadable.
pub(crate) fn free_huge_pages(huge: usize, page: usize) -> Option<usize> {
    let order = (huge / page).trailing_zeros() as usize;
    let text = std::fs::read_to_string("/proc/buddyinfo").ok()?;
    Some(parse_buddyinfo(&text, order))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(enabled: &str, defrag: &str) -> Option<Settings> {
        Settings::parse(enabled, defrag, Some("2097152\n"))
    }

    #[test]
    fn auto_advises_up_front_only_where_no_fault_compacts() {
        // `Auto` advising everything up front (the old huge-page default)
        // fails here: under `madvise` and `defer+madvise` an advised
        // first touch compacts on the run's thread.
        let cases = [
            (
                "always [madvise] never",
                "always defer defer+madvise [madvise] never",
                Policy::WhereFree,
            ),
            (
                "always [madvise] never",
                "always defer [defer+madvise] madvise never",
                Policy::WhereFree,
            ),
            (
                "always [madvise] never",
                "[always] defer defer+madvise madvise never",
                Policy::WhereFree,
            ),
            (
                "always [madvise] never",
                "always [defer] defer+madvise madvise never",
                Policy::Advise,
            ),
            (
                "always [madvise] never",
                "always defer defer+madvise madvise [never]",
                Policy::Advise,
            ),
            (
                "[always] madvise never",
                "always defer defer+madvise [madvise] never",
                Policy::Unadvised,
            ),
            (
                "[always] madvise never",
                "always defer [defer+madvise] madvise never",
                Policy::Unadvised,
            ),
            (
                "[always] madvise never",
                "always [defer] defer+madvise madvise never",
                Policy::Unadvised,
            ),
            (
                "[always] madvise never",
                "always defer defer+madvise madvise [never]",
                Policy::Unadvised,
            ),
            (
                "[always] madvise never",
                "[always] defer defer+madvise madvise never",
                Policy::WhereFree,
            ),
            (
                "always madvise [never]",
                "always defer defer+madvise [madvise] never",
                Policy::Off,
            ),
        ];
        for (enabled, defrag, want) in cases {
            assert_eq!(
                policy(HugePages::Auto, settings(enabled, defrag)),
                want,
                "{enabled} / {defrag}"
            );
        }
        assert_eq!(policy(HugePages::Auto, None), Policy::Off);
    }

    #[test]
    fn forcing_either_way_ignores_defrag() {
        for defrag in [
            "[always]",
            "[madvise]",
            "[defer+madvise]",
            "[defer]",
            "[never]",
        ] {
            for enabled in ["[always] madvise never", "always [madvise] never"] {
                let s = settings(enabled, defrag);
                assert_eq!(
                    policy(HugePages::Advise, s),
                    Policy::Advise,
                    "{enabled} {defrag}"
                );
                assert_eq!(
                    policy(HugePages::Never, s),
                    Policy::Off,
                    "{enabled} {defrag}"
                );
            }
            // No huge pages to force where the system offers none.
            let off = settings("always madvise [never]", defrag);
            assert_eq!(policy(HugePages::Advise, off), Policy::Off);
        }
    }

    #[test]
    fn settings_parse_or_refuse() {
        let s = settings("always [madvise] never", "[defer] x").unwrap();
        assert_eq!(
            (s.size, s.enabled, s.defrag),
            (2 << 20, Enabled::Madvise, Defrag::Defer)
        );
        // An unknown defrag is taken as one that compacts.
        assert_eq!(
            settings("[always]", "[new-mode]").unwrap().defrag,
            Defrag::Always
        );
        assert_eq!(settings("[always]", "").unwrap().defrag, Defrag::Always);
        assert_eq!(settings("always madvise never", ""), None);
        assert_eq!(settings("[sometimes]", ""), None);
        assert_eq!(Settings::parse("[always]", "", Some("3000000")), None);
        assert_eq!(Settings::parse("[always]", "", None).unwrap().size, 2 << 20);
    }

    #[test]
    fn buddyinfo_counts_huge_blocks_outside_dma() {
        let text = "Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3 \n\
                    Node 0, zone    DMA32      1      1      4      2      5      4      3      3      4      2    752 \n\
                    Node 0, zone   Normal     34    744   2510    411    316    155     59     14     25      7     10 \n";
        // Order 9: DMA32 2 + 752 * 2, Normal 7 + 10 * 2; DMA left out.
        assert_eq!(parse_buddyinfo(text, 9), 2 + 1504 + 7 + 20);
        assert_eq!(parse_buddyinfo(text, 10), 752 + 10);
        assert_eq!(parse_buddyinfo("garbage\n", 9), 0);
    }

    #[test]
    fn a_commit_takes_at_most_half_the_free_huge_pages_past_a_margin() {
        assert_eq!(huge_pages_to_take(None, 10), 0);
        assert_eq!(huge_pages_to_take(Some(MARGIN), 10), 0);
        assert_eq!(huge_pages_to_take(Some(MARGIN + 1), 10), 0);
        assert_eq!(huge_pages_to_take(Some(MARGIN + 8), 10), 4);
        assert_eq!(huge_pages_to_take(Some(MARGIN + 20), 10), 10);
        assert_eq!(huge_pages_to_take(Some(usize::MAX), 10), 10);
        assert_eq!(huge_pages_to_take(Some(usize::MAX), 0), 0);
    }
}
