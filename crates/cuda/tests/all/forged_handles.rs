//! Issue 19, review finding 1: safe code cannot hand a driver forged,
//! foreign or destroyed handles. Each driver instance names its handles and
//! refuses another's before any call; destroying an event or releasing
//! memory takes the handle (a `compile_fail` doctest on `EventHandle` pins
//! that it cannot be used again); streams the simulated driver makes are
//! marked, and the real driver refuses them (unit tests of
//! `driver::cuda`, which need no GPU).

use crate::common::SMALL;
use tensor_arena_cuda::driver::{Driver, CUDA_ERROR_INVALID_VALUE};
use tensor_arena_cuda::{SimDriver, Stream};

#[test]
fn another_drivers_event_is_refused() {
    let (one, two) = (SimDriver::new(SMALL), SimDriver::new(SMALL));
    assert_ne!(one.id(), two.id());
    let e = one.event_create().unwrap();
    let s = two.stream();
    let before = two.calls();
    for err in [
        two.event_record(&e, s).unwrap_err(),
        two.event_query(&e).unwrap_err(),
        two.stream_wait_event(s, &e).unwrap_err(),
    ] {
        assert_eq!(err.code, CUDA_ERROR_INVALID_VALUE, "{err}");
        assert!(err.detail.contains("another driver"), "{err}");
    }
    assert!(two.event_destroy(e).is_err());
    assert_eq!(
        two.calls().event_record,
        before.event_record,
        "refused before the call"
    );
}

#[test]
fn another_drivers_memory_handle_is_refused() {
    let (one, two) = (SimDriver::new(SMALL), SimDriver::new(SMALL));
    let g = SMALL.granularity;
    let base = two.address_reserve(g, 0).unwrap();
    let h = one.mem_create(g).unwrap();
    // SAFETY: the simulated driver checks everything; host memory only.
    let err = unsafe { two.mem_map(base, g, &h) }.unwrap_err();
    assert!(err.detail.contains("another driver"), "{err}");
    assert!(two.mem_release(h).is_err());
    assert_eq!(two.mapped_bytes(), 0);
}

#[test]
fn clones_of_a_simulated_driver_share_its_handles() {
    let one = SimDriver::new(SMALL);
    let clone = one.clone();
    assert_eq!(one.id(), clone.id());
    let e = one.event_create().unwrap();
    clone.event_record(&e, Stream::DEFAULT).unwrap();
    clone.event_destroy(e).unwrap();
}

#[test]
fn simulated_streams_are_marked() {
    let d = SimDriver::new(SMALL);
    let (a, b) = (d.stream(), d.stream());
    assert!(a.is_simulated() && b.is_simulated());
    assert_ne!(a, b);
    assert!(!Stream::DEFAULT.is_simulated());
    // SAFETY: any value is fine for the simulated driver; never given to
    // the real one here.
    let host = unsafe { Stream::from_raw(a.raw()) };
    assert!(!host.is_simulated());
    assert_ne!(host, a, "a host stream is not the simulated one");
}
