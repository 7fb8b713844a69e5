//! What a commit of `Pages` costs in page faults (the commit policy,
//! `docs/decisions.md`, "Huge pages without the stall"): a commit populates
//! its range in one call, in huge pages where the kernel has them free, so
//! a fresh commit of N MiB makes about N/2 faults (N*256 in base pages), a
//! buffer then written makes none, and a run repeated after a first one
//! makes none.
//!
//! Faults are the thread's own (`/proc/thread-self/stat`), so tests running
//! beside these do not count. What the kernel can give depends on the
//! machine: each test reads the THP settings and the free huge pages, and
//! asserts the huge-page figures where huge pages are certain, the
//! base-page ones where they are impossible, and what holds either way in
//! between.

#![cfg(target_os = "linux")]

use tensor_arena::{Arena, ArenaConfig, ShrinkPolicy};

const PAGE: usize = 4096;
const HUGE: usize = 2 << 20;
/// Faults that are not the commit's: the test's own reads of `/proc`, the
/// arena's bookkeeping growing on the heap, a stack page.
const SLACK: u64 = 64;
/// Faults of writing a populated block: none but the test's own (its
/// reading of `/proc`); far below one per huge page of the block.
const WRITE_SLACK: u64 = 8;

/// Faults that AddressSanitizer adds to touching `bytes` of fresh memory:
/// its shadow, one byte per eight, faults in on first touch too, with some
/// of its own bookkeeping. `.ci/reliability.sh` runs this file under it and
/// says so in `TENSOR_ARENA_SANITIZED=address` (`cfg(sanitize)` is not
/// stable). Zero in an ordinary build, where the bounds are the arena's
/// alone.
fn shadow(bytes: usize) -> u64 {
    if std::env::var("TENSOR_ARENA_SANITIZED").is_ok_and(|v| v == "address") {
        (bytes / 8).div_ceil(PAGE) as u64 + 512
    } else {
        0
    }
}

/// Minor faults of this thread so far (`/proc/thread-self/stat`, field 10).
fn thread_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("/proc/thread-self/stat");
    let after_name = &stat[stat.rfind(')').expect("stat's (comm)") + 1..];
    after_name
        .split_whitespace()
        .nth(7)
        .and_then(|f| f.parse().ok())
        .expect("minflt in /proc/thread-self/stat")
}

/// What this machine gives a commit of `bytes` in huge pages.
#[derive(Debug, PartialEq, Eq)]
enum Huge {
    /// Certain: THP is on for this process, and the kernel has far more free
    /// huge pages than the commit and the policy's margin need.
    Certain,
    /// Impossible: THP is `never`, absent, disabled for this process, or the
    /// huge page is not 2 MiB of 4 KiB pages.
    Impossible,
    /// Either (free huge pages near what the commit needs, or unknown).
    Either,
}

fn setting(name: &str) -> Option<String> {
    let text =
        std::fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{name}")).ok()?;
    Some(text.split('[').nth(1)?.split(']').next()?.to_string())
}

/// Free blocks of 2 MiB or more, in 2 MiB, outside the DMA zone.
fn free_huge() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/buddyinfo").ok()?;
    let mut total = 0;
    for line in text.lines() {
        let mut words = line.split_once("zone")?.1.split_whitespace();
        if words.next() == Some("DMA") {
            continue;
        }
        for (order, count) in words.enumerate().skip(9) {
            total += count.parse::<usize>().ok()? << (order - 9);
        }
    }
    Some(total)
}

fn huge_for(bytes: usize) -> Huge {
    let enabled = setting("enabled");
    let size = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    let process_off = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|s| s.lines().any(|l| l.replace(' ', "") == "THP_enabled:\t0"));
    if !matches!(enabled.as_deref(), Some("always" | "madvise"))
        || size != Some(HUGE)
        || process_off
        || rustix::param::page_size() != PAGE
    {
        return Huge::Impossible;
    }
    // Four times what the policy needs (twice the commit and a margin of
    // 16), so that the tests and builds beside this one cannot take it
    // between the reading and the commit; and room under the cgroup's
    // memory limit, where a huge page that cannot be charged falls back
    // to base pages.
    match free_huge() {
        Some(free) if free >= 4 * (bytes / HUGE) + 64 && cgroup_room() >= 4 * bytes => {
            Huge::Certain
        }
        _ => Huge::Either,
    }
}

/// Bytes this process's memory cgroup may still charge before its limit
/// (v2 `memory.max`, v1 `memory.limit_in_bytes`); `usize::MAX` without a
/// limit or a cgroup to read.
fn cgroup_room() -> usize {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let room = |dir: String, max: &str, current: &str| -> Option<usize> {
        let read = |name: &str| -> Option<usize> {
            std::fs::read_to_string(format!("{dir}/{name}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        Some(read(max)?.saturating_sub(read(current)?))
    };
    let mut least = usize::MAX;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            continue;
        };
        let found = if controllers.is_empty() {
            room(
                format!("/sys/fs/cgroup{path}"),
                "memory.max",
                "memory.current",
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            room(
                format!("/sys/fs/cgroup/memory{path}"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            None
        };
        least = least.min(found.unwrap_or(usize::MAX));
    }
    least
}

/// Whether the kernel has `MADV_POPULATE_WRITE` (Linux 5.14).
fn kernel_populates() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut nums = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    let (major, minor) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    (major, minor) >= (5, 14)
}

/// A fresh arena commits 64 MiB for one block: the commit populates the
/// range (faults at commit, none when the block is then written), in huge
/// pages where they are free. Reverting to faulting pages in on first
/// touch fails the write's bound; reverting `Auto` to base pages on a first
/// commit (the policy before) fails the huge-page bound where THP is
/// `madvise` and huge pages are free.
#[test]
fn a_fresh_commit_is_populated_at_once_in_huge_pages_where_free() {
    const N: usize = 64 << 20;
    let arena = Arena::new(ArenaConfig::default());
    let huge = huge_for(N);
    let before = thread_faults();
    let mut block = arena.try_alloc(N).unwrap();
    let at_commit = thread_faults() - before;
    let before = thread_faults();
    for page in block.chunks_mut(PAGE) {
        page[0] = 1;
    }
    let at_write = thread_faults() - before;
    let base = (N / PAGE) as u64;
    if kernel_populates() {
        assert!(
            at_write <= WRITE_SLACK + shadow(N),
            "{at_write} faults writing a committed block (populated: none expected)"
        );
    } else {
        // No populate: the pages fault in as they are written.
        assert!(at_commit <= SLACK, "{at_commit} faults at commit");
    }
    let faults = at_commit + at_write;
    // Huge pages found slow to populate (a guest whose free memory went
    // back to its host) are not taken: base pages then, as the policy says.
    let huge = if arena.stats().slow_huge_commits > 0 && huge == Huge::Certain {
        Huge::Either
    } else {
        huge
    };
    match huge {
        Huge::Certain => assert!(
            faults <= (N / HUGE) as u64 + SLACK + shadow(N),
            "{faults} faults for {N} bytes with huge pages free ({:?} free, THP {:?}/{:?})",
            free_huge(),
            setting("enabled"),
            setting("defrag")
        ),
        Huge::Impossible => assert!(
            (base..=base + SLACK + shadow(N)).contains(&faults),
            "{faults} faults for {N} bytes in base pages ({base} pages)"
        ),
        Huge::Either => assert!(faults <= base + SLACK + shadow(N), "{faults} faults"),
    }
    drop(block);
}

/// A replay of alternating large and small runs, then the same replay
/// again: the first large run commits (huge pages where free: about one
/// fault per 2 MiB), every later run fits what the arena holds and makes
/// no fault. With `ShrinkPolicy::AfterEveryRun`, each large run after a
/// small one commits again, at the same cost as the first.
#[test]
fn a_repeated_replay_makes_no_faults_and_a_commit_one_per_huge_page() {
    // Blocks of each run (bytes), several live at once, as a model's run.
    let large: Vec<usize> = vec![6 << 20, 12 << 20, 5 << 20, 9 << 20, 3 << 20, 12 << 20];
    let small: Vec<usize> = large.iter().map(|b| b / 8).collect();
    let run = |arena: &Arena, sizes: &[usize]| -> u64 {
        let before = thread_faults();
        let r = arena.begin_run();
        let mut live = Vec::new();
        for (i, &bytes) in sizes.iter().enumerate() {
            let mut b = r.try_alloc(bytes).unwrap();
            for page in b.chunks_mut(PAGE) {
                page[0] = 1;
            }
            live.push(b);
            if i % 2 == 1 {
                // Two live at a time, then the older freed.
                live.remove(0);
            }
        }
        drop(live);
        r.finish();
        thread_faults() - before
    };
    let sum: usize = large.iter().sum();
    // Where huge pages are certain, about one fault per 2 MiB, unless the
    // arena found them slow to populate and took base pages.
    let bound = |huge: &Huge, arena: &Arena, committed: usize| -> u64 {
        let huge = *huge == Huge::Certain && arena.stats().slow_huge_commits == 0;
        shadow(committed)
            + SLACK
            + if huge {
                committed.div_ceil(HUGE) as u64
            } else {
                (committed / PAGE) as u64
            }
    };
    let huge = huge_for(sum);

    // Kept: the first large run commits, nothing after it faults.
    let arena = Arena::new(ArenaConfig::default());
    let first = run(&arena, &large);
    let committed = arena.stats().reserved;
    assert!(
        first <= bound(&huge, &arena, committed),
        "first run: {first} faults committing {committed} bytes ({huge:?})"
    );
    for pass in 0..2 {
        for (i, sizes) in [&small, &large, &small, &large].into_iter().enumerate() {
            let f = run(&arena, sizes);
            // Under AddressSanitizer, its allocator's own fresh pages (freed
            // chunks wait in its quarantine) fault in too: `shadow(0)`.
            assert!(
                f <= SLACK + shadow(0),
                "pass {pass} run {i}: {f} faults in cached memory"
            );
        }
    }
    assert_eq!(arena.stats().reserved, committed, "nothing given back");

    // Given back after each run: a large run after a small one commits its
    // memory again, at a fresh commit's cost (huge pages where free).
    let config = ArenaConfig {
        shrink_policy: ShrinkPolicy::AfterEveryRun,
        ..ArenaConfig::default()
    };
    let arena = Arena::new(config);
    let huge = huge_for(sum);
    run(&arena, &large);
    for i in 0..3 {
        run(&arena, &small);
        let held = arena.stats().reserved;
        let f = run(&arena, &large);
        let recommitted = arena.stats().reserved.max(committed) - held;
        let bound = bound(&huge, &arena, recommitted);
        assert!(
            f <= bound,
            "large run {i} after a small one: {f} faults for {recommitted} bytes ({huge:?})"
        );
    }
}
