//! How `Pages` gives decommitted memory back ([`GiveBack`]): at once, the
//! mapping's resident pages go; lazily (`MADV_FREE`), they stop counting as
//! used (the kernel's `LazyFree`) and come back, settled, on the next
//! commit.

#![cfg(target_os = "linux")]

use tensor_arena::memory::{GiveBack, HugePages, Pages, PagesConfig};
use tensor_arena::{Arena, ArenaConfig, RawArena};

const PAGE: usize = 4096;
const SMALL: usize = 64 << 10;
const LARGE: usize = 8 << 20;

fn pages(give_back: GiveBack) -> Pages {
    // Base pages: commits and decommits in 4 KiB granules, so the figures
    // below do not depend on whether the system offers huge pages.
    Pages::new(PagesConfig {
        reservation: 64 << 20,
        huge_pages: HugePages::Never,
        give_back,
    })
}

/// `Rss` and `LazyFree` (bytes) of the mapping of this process that holds
/// `addr`, from `/proc/self/smaps`.
fn mapping(addr: usize) -> (usize, usize) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
    let mut inside = false;
    let (mut rss, mut lazy) = (None, None);
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = head.split_once('-').filter(|_| !head.ends_with(':')) {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                if inside {
                    break;
                }
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if !inside {
            continue;
        }
        let kib = |l: &str| -> Option<usize> {
            l.split_whitespace()
                .nth(1)?
                .parse::<usize>()
                .ok()
                .map(|k| k * 1024)
        };
        if line.starts_with("Rss:") {
            rss = kib(line);
        } else if line.starts_with("LazyFree:") {
            lazy = kib(line);
        }
    }
    (
        rss.expect("the mapping holding the address, with its Rss"),
        lazy.unwrap_or(0),
    )
}

/// Pages of `addr..addr + len` that this process holds in memory (present
/// in `/proc/self/pagemap`), whether in use or lazily freed (`MADV_FREE`
/// leaves a page present until the kernel takes it). Exactly that range:
/// unlike a mapping's `Rss` in `smaps`, no other memory counts, even when
/// the kernel merges the arena's mapping with a neighbour (another test's
/// arena, made by a test running beside this one: the Rss figures then
/// hold its pages too).
fn resident_pages(addr: usize, len: usize) -> usize {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open("/proc/self/pagemap").expect("/proc/self/pagemap");
    f.seek(SeekFrom::Start((addr / PAGE * 8) as u64)).unwrap();
    let mut entries = vec![0u8; len.div_ceil(PAGE) * 8];
    f.read_exact(&mut entries)
        .expect("the range's pagemap entries");
    entries
        .chunks_exact(8)
        .filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) >> 63 == 1)
        .count()
}

/// A small block kept live at the bottom, a large one written and freed
/// above it (checked resident), then the arena shrunk to what is in use:
/// returns the arena, the small block's address, and the mapping's
/// `(Rss, LazyFree)` after the shrink.
fn shrink_after_large(give_back: GiveBack) -> (Arena<Pages>, usize, (usize, usize)) {
    let (arena, addr, _, after) = shrink_after_large_at(give_back);
    (arena, addr, after)
}

/// [`shrink_after_large`], with the large block's address too.
fn shrink_after_large_at(give_back: GiveBack) -> (Arena<Pages>, usize, usize, (usize, usize)) {
    let arena = Arena::with_memory(ArenaConfig::default(), pages(give_back)).unwrap();
    let addr;
    {
        let mut small = arena.try_alloc(SMALL).unwrap();
        small.fill(1);
        addr = small.as_ptr() as usize;
        std::mem::forget(small);
    }
    let mut large = arena.try_alloc(LARGE).unwrap();
    large.fill(0xab);
    let large_addr = large.as_ptr() as usize;
    drop(large);
    assert_eq!(
        resident_pages(large_addr, LARGE),
        LARGE / PAGE,
        "the large block was resident"
    );
    let before = mapping(addr);
    let reserved = arena.stats().reserved;
    let released = arena.shrink_to(arena.stats().in_use);
    assert!(
        released >= LARGE,
        "the large block's granules were decommitted"
    );
    assert_eq!(arena.stats().reserved, reserved - released);
    assert!(
        before.0 >= LARGE,
        "the large block was resident: {before:?}"
    );
    (arena, addr, large_addr, mapping(addr))
}

/// Measured on the large block's own pages, as
/// `give_back_now_takes_lazily_given_back_pages_out_of_the_process` is
/// (a neighbouring mapping's pages would count in the mapping's figures).
#[test]
fn given_back_now_the_pages_leave_the_process() {
    let (_arena, _addr, large, _after) = shrink_after_large_at(GiveBack::Now);
    assert_eq!(
        resident_pages(large, LARGE),
        0,
        "pages of the large block still held (in use or lazily free)"
    );
}

#[test]
fn given_back_lazily_the_pages_stop_counting_and_come_back_settled() {
    let (arena, addr, large_addr, after) = shrink_after_large_at(GiveBack::Lazily);
    // Each page of the large block is either still present and lazily
    // free, or already taken by the kernel, but for its start that shares
    // a granule with the small block below it (kept committed): its
    // present pages are at most the mapping's `LazyFree` and that granule.
    // Counted on the block's own pages, not as the mapping's `Rss` less
    // `LazyFree`: memory that the kernel merged into the mapping (another
    // test's, beside this one) adds its pages in use to that figure (seen
    // once on CI: 1.9 MiB in use where the small block is 64 KiB), and
    // only lazily freed pages add to `LazyFree`.
    let present = resident_pages(large_addr, LARGE) * PAGE;
    assert!(
        present <= after.1 + (1 << 20),
        "{present} bytes of the large block present, {} lazily free (mapping {after:?})",
        after.1
    );
    assert!(!arena.memory_props().zeroed);
    // Committed again: each page was written once, so none is lazily free
    // any more and the bytes hold still: what they held or zero, and the
    // first byte of each page zero.
    let commits = arena.stats().commits;
    let large = arena.try_alloc(LARGE).unwrap();
    assert!(
        arena.stats().commits > commits,
        "the range was committed again"
    );
    assert_eq!(mapping(addr).1, 0, "no page left lazily free");
    let start = large.as_ptr() as usize;
    for (i, &b) in large.iter().enumerate() {
        assert!(b == 0xab || b == 0, "byte {i} reads {b:#x}");
        if (start + i) % PAGE == 0 {
            assert_eq!(b, 0, "the first byte of the page at +{i}");
        }
    }
    let first: Vec<u8> = large.to_vec();
    assert_eq!(&first[..], &large[..], "the bytes hold still");
    drop(large);
}

#[test]
fn lazily_given_back_bytes_are_tracked_until_committed_again() {
    let mut core = RawArena::new(ArenaConfig::default(), pages(GiveBack::Lazily)).unwrap();
    let keep = core.alloc(SMALL, 64).unwrap();
    let a = core.alloc(LARGE, 64).unwrap();
    core.free(a.handle).unwrap();
    assert_eq!(core.stats().lazily_given_back, 0);
    let released = core.shrink_to(core.stats().in_use);
    assert!(released >= LARGE);
    assert_eq!(core.stats().lazily_given_back, released);
    // Half of it committed again leaves the rest lazily given back.
    let b = core.alloc(LARGE / 2, 64).unwrap();
    let left = core.stats().lazily_given_back;
    assert!(left > 0 && left < released, "{left} of {released}");
    core.free(b.handle).unwrap();
    core.free(keep.handle).unwrap();
    // Shrunk to nothing, the reservation goes and its ranges with it.
    core.shrink_to(0);
    assert_eq!(core.stats().reserved, 0);
    assert_eq!(core.stats().lazily_given_back, 0);
}

/// Measured on the large block's own pages (`/proc/self/pagemap`), not
/// on its mapping's `Rss` and `LazyFree`: a test beside this one may make
/// an arena whose mapping the kernel merges with this one's, and its pages
/// then count in those figures (seen: one failure in ten runs on a loaded
/// machine). After `give_back_now` not one page of the range is held,
/// whoever else shares the mapping.
#[test]
fn give_back_now_takes_lazily_given_back_pages_out_of_the_process() {
    let (arena, _addr, large, _after) = shrink_after_large_at(GiveBack::Lazily);
    let lazy = arena.stats().lazily_given_back;
    assert!(lazy >= LARGE, "{lazy}");
    assert_eq!(arena.give_back_now(), lazy);
    assert_eq!(arena.stats().lazily_given_back, 0);
    assert_eq!(arena.give_back_now(), 0, "a second call has nothing left");
    // Not one page of the large block is held any more, in use or lazily
    // free.
    assert_eq!(
        resident_pages(large, LARGE),
        0,
        "pages of the large block still held after give_back_now"
    );
    // Committed again, the range comes from the kernel as zero pages.
    let large = arena.try_alloc(LARGE).unwrap();
    assert!(large.iter().all(|&b| b == 0));
    // On a layer that gives back at once there is nothing to do.
    let (now, ..) = shrink_after_large(GiveBack::Now);
    assert_eq!(now.stats().lazily_given_back, 0);
    assert_eq!(now.give_back_now(), 0);
}
