//! Out of memory is an error, never a crash: each case runs in a child
//! process (this binary run again with `EXHAUSTION_CHILD=<case>`) that sets
//! its own limit with `setrlimit` first, so no case can push the machine
//! toward the kernel's out-of-memory killer. Each child shows an `Err`, a
//! live process, intact live blocks and a smaller request served after it.
//!
//! The overcommit case asks for more than the machine has (memory and swap
//! together) without touching it, and asserts what the system's overcommit
//! mode (`/proc/sys/vm/overcommit_memory`) says must happen; it never skips.
//!
//! Without libtest (`harness = false`): the children are not tests, so no
//! test passes by doing nothing in the parent.

#[path = "support/child.rs"]
mod child;

use child::{kib_field, limit_data_to_now_plus, run_child, set_limit, GIB, MIB};
use rustix::process::Resource;
use tensor_arena::memory::ErrorCode;
use tensor_arena::{Arena, ArenaConfig, ArenaError, Block};

fn main() {
    child::main(
        &[
            ("rlimit_as_reservation_leaves_room", rlimit_as),
            ("rlimit_data_commit_is_an_error", rlimit_data),
            ("overcommit_mode_refuses_what_malloc_would", overcommit),
            ("shrink_gives_the_charge_back", shrink_gives_back),
        ],
        run_case,
    );
}

fn rlimit_as() {
    let out = run_child("as");
    assert!(out.contains("refused: out of memory"), "{out}");
}

fn rlimit_data() {
    let out = run_child("data");
    assert!(out.contains("refused: CommitFailed ENOMEM"), "{out}");
}

fn overcommit() {
    let mode = overcommit_mode();
    let out = run_child("overcommit");
    match mode {
        // Heuristic and strict: a commit larger than memory and swap is
        // refused, as a `malloc` of it is.
        0 | 2 => assert!(
            out.contains("refused: CommitFailed ENOMEM"),
            "mode {mode}: {out}"
        ),
        // Always overcommit: the kernel grants any commit, and `malloc`
        // too; the arena serves it (untouched) and gives it back.
        1 => assert!(out.contains("granted untouched"), "mode 1: {out}"),
        other => panic!("unknown overcommit mode {other}"),
    }
}

fn shrink_gives_back() {
    let out = run_child("shrink");
    assert!(out.contains("second arena served"), "{out}");
}

fn overcommit_mode() -> u32 {
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory")
        .expect("/proc/sys/vm/overcommit_memory is readable")
        .trim()
        .parse()
        .expect("the overcommit mode is a number")
}

/// Three small blocks with a pattern each.
fn patterned(arena: &Arena) -> Vec<Block<'_>> {
    (0..3u8)
        .map(|i| {
            let mut b = arena.try_alloc(MIB + i as usize * 4096).unwrap();
            b.fill(0xA0 + i);
            b
        })
        .collect()
}

fn assert_intact(blocks: &[Block<'_>]) {
    for (i, b) in blocks.iter().enumerate() {
        assert!(
            b.iter().all(|&x| x == 0xA0 + i as u8),
            "live block {i} changed"
        );
    }
}

/// After a refusal: the live blocks are intact, the arena is as it was,
/// and a smaller request is served (and written).
fn after_refusal(arena: &Arena, blocks: &[Block<'_>], before: tensor_arena::Stats, small: usize) {
    assert_intact(blocks);
    let after = arena.stats();
    assert_eq!(after.in_use, before.in_use, "in use changed");
    assert_eq!(after.live_blocks, before.live_blocks);
    let mut b = arena
        .try_alloc(small)
        .expect("a smaller request after the refusal");
    b.fill(7);
    assert!(b.iter().all(|&x| x == 7));
    drop(b);
    assert_intact(blocks);
    println!("child: smaller request of {small} bytes served");
}

fn run_case(case: &str) {
    match case {
        "as" => child_as(),
        "data" => child_data(),
        "overcommit" => child_overcommit(),
        "shrink" => child_shrink(),
        other => panic!("unknown case {other}"),
    }
}

/// `ulimit -v`: the arena's reservation takes at most half of what is left,
/// a request past it is an error, and the rest of the process can still
/// allocate.
fn child_as() {
    let vm = kib_field("/proc/self/status", "VmSize:");
    let left = 3 * GIB / 2;
    let limit = vm + left;
    set_limit(Resource::As, limit);
    let arena = Arena::new(ArenaConfig::default());
    let blocks = patterned(&arena);
    let vm_after = kib_field("/proc/self/status", "VmSize:");
    // Half of what was left, plus alignment slack (a huge page) and what
    // the process maps besides.
    assert!(
        vm_after - vm <= left / 2 + 8 * MIB,
        "the reservation took {} of {} bytes left",
        vm_after - vm,
        limit - vm
    );
    let before = arena.stats();
    let err = arena.try_alloc(2 * GIB).unwrap_err();
    assert!(err.is_out_of_memory(), "{err:?}");
    println!("child: refused: out of memory: {err}");
    after_refusal(&arena, &blocks, before, 64 * MIB);
    // The rest of the process keeps the other half.
    let mut v: Vec<u8> = Vec::new();
    v.try_reserve_exact(600 * MIB)
        .expect("malloc of 600 MiB beside the arena");
    v.resize(600 * MIB, 1);
    assert_eq!(v.iter().map(|&x| x as usize).sum::<usize>(), 600 * MIB);
    println!("child: malloc of 600 MiB served beside the arena");
}

/// `RLIMIT_DATA`: a commit past it is `CommitFailed` with `ENOMEM`, naming
/// the bytes asked for and committed.
fn child_data() {
    limit_data_to_now_plus(512 * MIB);
    let arena = Arena::new(ArenaConfig::default());
    let blocks = patterned(&arena);
    let before = arena.stats();
    let err = arena.try_alloc(GIB).unwrap_err();
    match err {
        ArenaError::CommitFailed {
            requested,
            bytes,
            committed,
            code: Some(ErrorCode::Os(12)),
        } => {
            assert_eq!(requested, GIB);
            assert!(bytes >= GIB - committed, "{bytes} {committed}");
            assert_eq!(committed, before.reserved);
            let text = err.to_string();
            assert!(text.contains("out of memory"), "{text}");
            assert!(text.contains(&committed.to_string()), "{text}");
            println!("child: refused: CommitFailed ENOMEM: {text}");
        }
        other => panic!("expected CommitFailed ENOMEM, got {other:?}"),
    }
    after_refusal(&arena, &blocks, before, 64 * MIB);
}

/// More than memory and swap together, never touched.
fn child_overcommit() {
    let total = kib_field("/proc/meminfo", "MemTotal:") + kib_field("/proc/meminfo", "SwapTotal:");
    let arena = Arena::new(ArenaConfig::default());
    let blocks = patterned(&arena);
    let before = arena.stats();
    let ask = total + 4 * GIB;
    match arena.try_alloc(ask) {
        Err(ArenaError::CommitFailed {
            code: Some(ErrorCode::Os(12)),
            ..
        }) => println!("child: refused: CommitFailed ENOMEM for {ask} bytes"),
        Err(other) => panic!("expected CommitFailed ENOMEM, got {other:?}"),
        Ok(block) => {
            // Not a byte of it is touched.
            assert_eq!(block.len(), ask);
            drop(block);
            arena.shrink_to(0);
            println!("child: granted untouched");
        }
    }
    after_refusal(&arena, &blocks, before, 64 * MIB);
}

/// What a shrink gives back counts against the limit no more: under
/// `RLIMIT_DATA`, a second arena commits what the first gave back.
fn child_shrink() {
    limit_data_to_now_plus(512 * MIB);
    let first = Arena::new(ArenaConfig::default());
    let mut b = first.try_alloc(384 * MIB).unwrap();
    b.fill(1);
    drop(b);
    let second = Arena::new(ArenaConfig::default());
    let err = second.try_alloc(384 * MIB).unwrap_err();
    assert!(matches!(err, ArenaError::CommitFailed { .. }), "{err:?}");
    let released = first.shrink_to(0);
    assert!(released >= 384 * MIB, "released {released}");
    let mut b = second.try_alloc(384 * MIB).expect("after the first shrank");
    b.fill(2);
    println!("child: second arena served after the first gave back {released} bytes");
}
