//! The stream rule: reuse on the freeing stream at once; reuse on another
//! stream waits on an event recorded at the free.

use crate::common::{assert_device_clean, sim_access, sim_arena, sim_map, SMALL};
use tensor_arena_cuda::driver::Driver;
use tensor_arena_cuda::{DeviceConfig, SimDriver};

#[test]
fn the_checker_sees_unordered_cross_stream_use() {
    // The simulation itself: two streams touching the same bytes with no
    // event between them is a hazard; with one, it is not.
    let d = SimDriver::new(SMALL);
    let g = SMALL.granularity;
    let base = d.address_reserve(g, 0).unwrap();
    let h = d.mem_create(g).unwrap();
    sim_map(&d, base, g, &h).unwrap();
    sim_access(&d, base, g).unwrap();
    let (s1, s2) = (d.stream(), d.stream());
    d.launch(s1, base, 100).unwrap();
    d.launch(s2, base, 100).unwrap();
    assert_eq!(d.hazards().len(), 1, "unordered use must be flagged");
    let e = d.event_create().unwrap();
    d.event_record(&e, s2).unwrap();
    d.stream_wait_event(s1, &e).unwrap();
    d.launch(s1, base, 100).unwrap();
    assert_eq!(d.hazards().len(), 1, "ordered through the event");
    // Finished work needs no event either.
    d.complete(s1);
    d.launch(s2, base, 50).unwrap();
    assert_eq!(d.hazards().len(), 1);
}

#[test]
fn same_stream_reuse_is_immediate_and_records_nothing() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    let s = sim.stream();
    let p = a.alloc(100_000, s).unwrap();
    sim.launch(s, p, 100_000).unwrap();
    a.free(p, s).unwrap();
    let q = a.alloc(100_000, s).unwrap();
    assert_eq!(p, q, "the freed block is reused at once");
    sim.launch(s, q, 100_000).unwrap();
    a.free(q, s).unwrap();
    let st = a.stats().streams;
    assert!(!st.multi_stream);
    assert_eq!((st.events_recorded, st.waits), (0, 0));
    assert_eq!(sim.calls().event_record + sim.calls().stream_wait_event, 0);
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn reuse_on_another_stream_waits_on_the_free() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    let (s1, s2) = (sim.stream(), sim.stream());
    // Both streams known: every free records an event.
    let warm = a.alloc(512, s2).unwrap();
    a.free(warm, s2).unwrap();
    let p = a.alloc(100_000, s1).unwrap();
    sim.launch(s1, p, 100_000).unwrap();
    a.free(p, s1).unwrap();
    // s1's kernel may still run: s2 gets the same bytes, ordered after it.
    let q = a.alloc(100_000, s2).unwrap();
    assert_eq!(p, q);
    sim.launch(s2, q, 100_000).unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert!(a.stats().streams.waits >= 1);
    a.free(q, s2).unwrap();
    // Back on s1: it waits on s2's free in turn.
    let r = a.alloc(100_000, s1).unwrap();
    sim.launch(s1, r, 100_000).unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    a.free(r, s1).unwrap();
    a.check_invariants();
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn frees_before_the_second_stream_appeared_are_covered() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    let (s1, s2) = (sim.stream(), sim.stream());
    // One stream only: no events.
    let blocks: Vec<_> = (0..4).map(|_| a.alloc(200_000, s1).unwrap()).collect();
    for &p in &blocks {
        sim.launch(s1, p, 200_000).unwrap();
        a.free(p, s1).unwrap();
    }
    assert_eq!(sim.calls().event_record, 0);
    // The second stream takes the first stream's freed bytes.
    let q = a.alloc(800_000, s2).unwrap();
    sim.launch(s2, q, 800_000).unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    a.free(q, s2).unwrap();
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn a_block_spanning_frees_of_several_streams_waits_on_each() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    let (s1, s2, s3) = (sim.stream(), sim.stream(), sim.stream());
    let x = a.alloc(64_000, s1).unwrap();
    let y = a.alloc(64_000, s2).unwrap();
    sim.launch(s1, x, 64_000).unwrap();
    sim.launch(s2, y, 64_000).unwrap();
    a.free(x, s1).unwrap();
    a.free(y, s2).unwrap();
    // Coalesced: one block over both.
    let z = a.alloc(128_000, s3).unwrap();
    sim.launch(s3, z, 128_000).unwrap();
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    a.free(z, s3).unwrap();
    a.check_invariants();
    drop(a);
    assert_device_clean(&sim);
}

#[test]
fn shrink_waits_for_queued_work_before_unmapping() {
    let (mut a, sim) = sim_arena(SMALL, DeviceConfig::default());
    let s = sim.stream();
    a.begin_run(b"r").unwrap();
    let p = a.alloc(1 << 20, s).unwrap();
    sim.launch(s, p, 1 << 20).unwrap();
    a.free(p, s).unwrap();
    a.end_run().unwrap();
    // The kernel on `s` has not finished; shrinking to nothing must not
    // pull its memory away (the simulation flags an unmap under work).
    let released = a.shrink_to(0);
    assert!(released > 0);
    assert!(sim.hazards().is_empty(), "{:?}", sim.hazards());
    assert!(a.stats().calls.synchronize >= 1);
    drop(a);
    assert_device_clean(&sim);
}
