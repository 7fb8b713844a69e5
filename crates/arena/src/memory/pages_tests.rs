//! The huge-page policy of [`Pages`](super::Pages)'s commits, tested on
//! this machine's kernel.

use super::*;

const HUGE: usize = 2 << 20;
const LEN: usize = 8 << 20;

/// A layer with `policy` whatever the system's settings, and `free`
/// free huge pages whenever it asks.
fn pages(policy: Policy, free: fn(usize, usize) -> Option<usize>) -> Pages {
    let mut p = Pages::new(PagesConfig {
        reservation: 4 * LEN,
        huge_pages: HugePages::Never,
        give_back: GiveBack::Now,
    });
    p.huge = HUGE;
    p.policy = policy;
    p.free_huge = free;
    p
}

/// Minor faults of this thread so far.
fn thread_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(7).unwrap().parse().unwrap()
}

/// `VmFlags` of the mapping holding `addr` (`/proc/self/smaps`).
fn vm_flags(addr: usize) -> Vec<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = head.split_once('-').filter(|_| !head.ends_with(':')) {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.split_whitespace().map(str::to_string).collect();
            }
        }
    }
    panic!("no mapping holds {addr:#x}");
}

/// Commits `len` bytes of a fresh reservation; returns the faults and
/// the committed range's `VmFlags`.
fn commit(p: &mut Pages, len: usize) -> (u64, Vec<String>) {
    let base = p.reserve(4 * len, HUGE).unwrap();
    let before = thread_faults();
    p.commit(base, 0, len).unwrap();
    let faults = thread_faults() - before;
    let flags = vm_flags(base.as_ptr() as usize);
    p.release(base, 4 * len, HUGE);
    (faults, flags)
}

/// Where a fault would compact and the kernel has no free huge page,
/// the commit is populated in base pages (one fault each, never a
/// huge page, so no compaction) and advised only after, for
/// khugepaged. Fails if `WhereFree` advises before populating.
#[test]
fn without_free_huge_pages_a_commit_takes_base_pages_then_advises() {
    let mut p = pages(Policy::WhereFree, |_, _| Some(0));
    let (faults, flags) = commit(&mut p, LEN);
    let base = (LEN / 4096) as u64;
    assert!(
        (base..base + 32).contains(&faults),
        "{faults} faults for {base} base pages"
    );
    if p.populate {
        assert!(flags.iter().any(|f| f == "hg"), "advised after: {flags:?}");
    } else {
        // No populate (before Linux 5.14): pages fault in later, so
        // the range stays kept from huge pages.
        assert!(flags.iter().any(|f| f == "nh"), "{flags:?}");
    }
    // Unknown (no /proc/buddyinfo) is taken as none free.
    let mut p = pages(Policy::WhereFree, |_, _| None);
    assert!(commit(&mut p, LEN).0 >= base);
}

/// With free huge pages for part of the range, that part is advised
/// before it is populated, and the rest populated in base pages and
/// advised after.
#[test]
fn with_free_huge_pages_for_part_of_a_commit_that_part_takes_them() {
    // 16 kept as a margin, half of the other 4: 2 of the 4 huge pages.
    let p = pages(Policy::WhereFree, |_, _| Some(20));
    // The best of three (another process may take the free huge pages).
    let (faults, flags) = (0..3)
        .map(|_| commit(&mut pages(Policy::WhereFree, |_, _| Some(20)), LEN))
        .min_by_key(|(faults, _)| *faults)
        .expect("three commits");
    let half = (LEN / 2 / 4096) as u64;
    let offered = thp::Settings::read().is_some_and(|s| s.enabled != thp::Enabled::Never);
    let free = thp::free_huge_pages(HUGE, 4096).unwrap_or(0);
    // The base-page half: one fault per page, whatever the system has.
    assert!(
        faults >= half,
        "{faults} faults: fewer than the base-page half's {half}"
    );
    if offered && free >= 64 && p.populate {
        assert!(faults <= half + 2 + 32, "{faults} faults");
    }
    assert!(faults <= 2 * half + 32, "{faults} faults");
    if p.populate {
        assert!(flags.iter().any(|f| f == "hg"), "advised: {flags:?}");
    }
}

/// With free huge pages, the range is advised before it is populated:
/// one fault per huge page where the system offers them.
#[test]
fn with_free_huge_pages_a_commit_is_advised_first() {
    let p = pages(Policy::WhereFree, |_, _| Some(1 << 20));
    // The best of three commits: another process may take the free huge
    // pages between their count and the faults (1,026 faults once, beside
    // a build; an unadvised commit faults that on every try).
    let (faults, flags) = (0..3)
        .map(|_| commit(&mut pages(Policy::WhereFree, |_, _| Some(1 << 20)), LEN))
        .min_by_key(|(faults, _)| *faults)
        .expect("three commits");
    assert!(flags.iter().any(|f| f == "hg"), "{flags:?}");
    let offered = thp::Settings::read().is_some_and(|s| s.enabled != thp::Enabled::Never);
    let free = thp::free_huge_pages(HUGE, 4096).unwrap_or(0);
    if offered && free >= 64 && p.populate {
        assert!(faults <= (LEN / HUGE) as u64 + 32, "{faults} faults");
    } else {
        assert!(faults <= (LEN / 4096) as u64 + 32, "{faults} faults");
    }
    // `Off` and `Unadvised` ask nothing.
    for policy in [Policy::Off, Policy::Unadvised] {
        let (_, flags) = commit(&mut pages(policy, |_, _| Some(0)), LEN);
        assert!(
            !flags.iter().any(|f| f == "hg" || f == "nh"),
            "{policy:?}: {flags:?}"
        );
    }
}

/// A commit of 64 MiB of a fresh reservation; returns its faults.
fn commit_large(p: &mut Pages) -> u64 {
    const BIG: usize = 64 << 20;
    let base = p.reserve(2 * BIG, HUGE).unwrap();
    let before = thread_faults();
    p.commit(base, 0, BIG).unwrap();
    let faults = thread_faults() - before;
    p.release(base, 2 * BIG, HUGE);
    faults
}

/// Where the first huge pages of a large commit are slow to populate
/// (here: any time is slow), the rest of it takes base pages; where
/// they are not, the probe changes nothing. Fails if the probe is
/// removed (no slow commit counted, huge pages throughout where the
/// system has them).
#[test]
fn a_commit_whose_first_huge_pages_are_slow_takes_base_pages_for_the_rest() {
    let mut p = pages(Policy::WhereFree, |_, _| Some(1 << 20));
    if !p.populate {
        return; // before Linux 5.14 nothing is populated, nor probed
    }
    p.slow_huge = Duration::ZERO;
    let base_pages = ((64 << 20) / 4096) as u64;
    let probed = (PROBE * HUGE / 4096) as u64;
    let faults = commit_large(&mut p);
    assert_eq!(p.slow_huge_commits(), 1);
    assert!(
        faults >= base_pages - probed,
        "{faults} faults: the rest was not in base pages"
    );
    // Each commit is timed afresh.
    let faults = commit_large(&mut p);
    assert_eq!(p.slow_huge_commits(), 2);
    assert!(faults >= base_pages - probed, "{faults} faults");

    // Never slow: no commit counted, huge pages where the system has them.
    let mut p = pages(Policy::WhereFree, |_, _| Some(1 << 20));
    p.slow_huge = Duration::MAX;
    let faults = commit_large(&mut p);
    assert_eq!(p.slow_huge_commits(), 0);
    let offered = thp::Settings::read().is_some_and(|s| s.enabled != thp::Enabled::Never);
    let free = thp::free_huge_pages(HUGE, 4096).unwrap_or(0);
    if offered && free >= 4 * 32 + 64 {
        assert!(faults <= 32 + 32, "{faults} faults for 32 huge pages");
    }
    // Other policies never probe.
    let mut p = pages(Policy::Advise, |_, _| Some(0));
    p.slow_huge = Duration::ZERO;
    commit_large(&mut p);
    assert_eq!(p.slow_huge_commits(), 0);
}

/// Commits too small to probe are timed together, judged every
/// [`PROBE_MIN`] huge pages; once huge pages were found slow, every commit
/// in the next [`SLOW_FOR`] takes base pages at once (advised after, for
/// khugepaged), however small; then huge pages are asked for again. Fails
/// without the tally (small commits never found slow) or without the
/// remembered verdict (the next small commit takes huge pages).
#[test]
fn huge_pages_found_slow_are_not_asked_for_again_for_a_while() {
    let mut p = pages(Policy::WhereFree, |_, _| Some(1 << 20));
    if !p.populate {
        return; // before Linux 5.14 nothing is populated, nor timed
    }
    let offered = thp::Settings::read().is_some_and(|s| s.enabled != thp::Enabled::Never);
    let free = thp::free_huge_pages(HUGE, 4096).unwrap_or(0);
    let huge_free = offered && free >= 64;
    p.slow_huge = Duration::ZERO;
    for i in 1..=PROBE_MIN {
        let (faults, _) = commit(&mut p, HUGE);
        let judged = i == PROBE_MIN;
        assert_eq!(p.slow_huge_commits(), u64::from(judged), "commit {i}");
        if huge_free {
            assert!(
                faults <= 1 + 32,
                "commit {i}: {faults} faults for a huge page"
            );
        }
    }
    // Found slow: the next commit, one huge page, takes base pages.
    let base_pages = (HUGE / 4096) as u64;
    let (faults, flags) = commit(&mut p, HUGE);
    assert_eq!(p.slow_huge_commits(), 2);
    assert!(faults >= base_pages, "{faults} faults: not in base pages");
    assert!(flags.iter().any(|f| f == "hg"), "advised after: {flags:?}");
    // Long after: huge pages again (and they are fast now).
    p.slow_huge = Duration::MAX;
    p.slow_at = Instant::now().checked_sub(SLOW_FOR + Duration::from_secs(1));
    let (faults, _) = commit(&mut p, HUGE);
    assert_eq!(p.slow_huge_commits(), 2);
    if huge_free {
        assert!(faults <= 1 + 32, "{faults} faults for a huge page");
    }
}

thread_local! {
    /// The scripted clock's time, and how far each of its next readings
    /// moves it ([`scripted_clock`]).
    static SCRIPT: std::cell::RefCell<(Duration, std::collections::VecDeque<Duration>)> =
        Default::default();
}

/// A clock that moves by the next scripted step at each reading (none
/// left: it stands still).
fn scripted_clock() -> Duration {
    SCRIPT.with(|s| {
        let mut s = s.borrow_mut();
        let step = s.1.pop_front().unwrap_or_default();
        s.0 += step;
        s.0
    })
}

/// A large commit whose huge pages are fast but for its last step is
/// found slow all the same: the next commit, a single huge page, takes
/// base pages. Fails if a slow last step leaves no verdict (each later
/// commit then meets the slow blocks anew, as ONNX Runtime's growing
/// arena did on a guest whose free memory went back to its host).
#[test]
fn a_slow_last_step_leaves_its_verdict_for_the_next_commits() {
    let mut p = pages(Policy::WhereFree, |_, _| Some(1 << 20));
    if !p.populate {
        return; // before Linux 5.14 nothing is populated, nor timed
    }
    p.clock = scripted_clock;
    // 64 MiB: steps of 2, 8, 8, 8 and 6 huge pages, each read before and
    // after; only the last is slow.
    SCRIPT.with(|s| {
        let mut s = s.borrow_mut();
        s.1.extend([Duration::ZERO; 8]);
        s.1.extend([Duration::ZERO, Duration::from_secs(1)]);
    });
    commit_large(&mut p);
    assert_eq!(
        p.slow_huge_commits(),
        1,
        "the slow last step was not counted"
    );
    let (faults, _) = commit(&mut p, HUGE);
    assert_eq!(p.slow_huge_commits(), 2);
    assert!(
        faults >= (HUGE / 4096) as u64,
        "{faults} faults: the next commit asked for a huge page"
    );
}

/// While huge pages are held slow, a large commit of memory this layer
/// gave back moments ago is probed anew and takes huge pages where its
/// steps are fast; a smaller commit, or one of fresh memory, still takes
/// base pages at once. Fails if the verdict keeps every commit of the next
/// [`SLOW_FOR`] in base pages (an arena taking back a large run's memory,
/// freed moments before, populated it a base page at a time after one slow
/// step of an earlier commit), or if fresh memory is probed anew.
#[test]
fn a_large_commit_of_memory_just_given_back_is_probed_anew() {
    let mut p = pages(Policy::WhereFree, |_, _| Some(1 << 20));
    if !p.populate {
        return; // before Linux 5.14 nothing is populated, nor timed
    }
    p.clock = scripted_clock; // stands still: every step fast
    p.slow_at = Some(Instant::now());
    let offered = thp::Settings::read().is_some_and(|s| s.enabled != thp::Enabled::Never);
    let huge_free = offered && thp::free_huge_pages(HUGE, 4096).unwrap_or(0) >= 4 * 32 + 64;
    let base_pages = |len: usize| (len / 4096) as u64;
    // Fresh memory: the verdict holds.
    let faults = commit_large(&mut p);
    assert_eq!(p.slow_huge_commits(), 1);
    assert!(faults >= base_pages(64 << 20), "{faults} faults");
    // Given back moments ago (a decommit counts it): probed anew, fast.
    let base = p.reserve(128 << 20, HUGE).unwrap();
    p.commit(base, 0, 64 << 20).unwrap();
    p.decommit(base, 0, 64 << 20).unwrap();
    let before = thread_faults();
    p.commit(base, 0, 64 << 20).unwrap();
    let faults = thread_faults() - before;
    p.release(base, 128 << 20, HUGE);
    assert_eq!(p.slow_huge_commits(), 2, "the large commit took base pages");
    if huge_free {
        assert!(faults <= 32 + 32, "{faults} faults for 32 huge pages");
    }
    // A commit below the size probed anew follows the verdict.
    p.given_back = (Some(Instant::now()), 64 << 20);
    let (faults, _) = commit(&mut p, (REPROBE_MIN - 1) * HUGE);
    assert_eq!(p.slow_huge_commits(), 3);
    assert!(
        faults >= base_pages((REPROBE_MIN - 1) * HUGE),
        "{faults} faults"
    );
    // Probed anew and slow: the rest of it in base pages, the verdict
    // renewed.
    (p.slow_huge, p.clock) = (Duration::ZERO, thread_cpu);
    let faults = commit_large(&mut p);
    assert_eq!(p.slow_huge_commits(), 4);
    let probed = base_pages(PROBE_FIRST * HUGE);
    assert!(faults >= base_pages(64 << 20) - probed, "{faults} faults");
}
