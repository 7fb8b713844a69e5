//! The process's default memory limit with `TENSOR_ARENA_MEMORY_LIMIT`
//! unset, as a server started without it has: three quarters of the
//! process's cgroup limit, or half of `MemTotal` without one; never no
//! limit. (A binary of its own, with one test: the default is the
//! process's, and the variable is removed before anything reads it.)

use std::path::Path;
use tensor_arena_ort::{default_budget, default_memory_limit, LimitSource, MEMORY_LIMIT_ENV};

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn mem_total() -> usize {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let kib: usize = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("MemTotal in /proc/meminfo");
    kib * 1024
}

#[test]
fn with_the_variable_unset_the_limit_comes_from_the_system() {
    // The only test of this binary: nothing else reads the environment.
    std::env::remove_var(MEMORY_LIMIT_ENV);
    let limit = default_memory_limit()
        .unwrap()
        .expect("a default limit with the variable unset");
    match &limit.source {
        LimitSource::Cgroup(file) => {
            let group = tensor_arena::cgroup_limit_file(Path::new(file))
                .expect("the cgroup file the limit names holds a limit");
            // Three quarters of it, in bytes (not the constant times it:
            // a share set to 100% fails this).
            assert_eq!(limit.bytes as u128, group as u128 * 3 / 4, "{limit:?}");
        }
        LimitSource::MemTotal => assert_eq!(limit.bytes, mem_total() / 2, "{limit:?}"),
        other => panic!("the limit came from {other:?}, with the variable unset"),
    }
    assert!(limit.bytes > 0);
    // The first worker without a budget of its own commits under it.
    let budget = default_budget()
        .unwrap()
        .expect("a default budget with the variable unset");
    assert_eq!(budget.limit(), limit.bytes);
}
