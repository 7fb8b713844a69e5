//! Room the application asks for under the memory limit, beside the runs:
//! a decoded image, a preprocessing buffer, anything the arenas cannot see.
//!
//! | reservation | holds | ends |
//! |---|---|---|
//! | [`Admission::reserve`] | its bytes | when dropped; end it before the thread's runs |
//! | [`Admission::reserve_for_run`] | its bytes and the largest run admitted so far | when dropped, or when the thread's next run of this admission takes it over |
//!
//! A reservation for a run is what bounds a server's requests in flight
//! by memory, not only its runs: a request decodes its input only once
//! there is room for the decode and for the run that follows, so decoded
//! inputs never pile up waiting for runs that no longer fit beside them.
//! The run takes the promise over (what it does not need goes back at
//! once) without waiting its turn again; a run the promise does not cover
//! (larger, or one that must run alone) gives it back and waits as any
//! other.

use crate::admit::{Admission, Ticket};
use crate::OrtArenaError;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::sync::Arc;

/// A promise shared by a [`Reservation`] and its thread's next run.
type Held = Arc<Mutex<Option<Ticket>>>;

thread_local! {
    /// The reservation for a run this thread holds, with its admission's
    /// address: the next run admitted there takes it.
    static FOR_RUN: RefCell<Option<(usize, Held)>> = const { RefCell::new(None) };
}

/// The promise of the reservation for a run this thread holds under
/// `admission`, taken (the reservation then holds nothing), if any.
fn take_held_for_run(admission: &Arc<Admission>) -> Option<Ticket> {
    let at = Arc::as_ptr(admission) as usize;
    let held = FOR_RUN
        .try_with(|r| {
            let mut r = r.borrow_mut();
            match &*r {
                Some((a, _)) if *a == at => r.take().map(|(_, h)| h),
                _ => None,
            }
        })
        .ok()
        .flatten()?;
    let ticket = held.lock().take();
    ticket
}

/// Bytes promised to the application under an [`Admission`]'s limit, given
/// back when dropped ([`Admission::reserve`],
/// [`Admission::reserve_for_run`]).
///
/// Hold one around work that allocates outside the arenas (decoding a
/// request's image, say): a reservation waits its turn with the runs
/// (first come, first served), counts with them against the limit while
/// held, and the room it leaves is the limit less what the rest of every
/// process holds. A plain reservation held while a run of the same thread
/// waits for admission can wait on itself under a tight limit: end it
/// first, or make it a reservation for the run.
pub struct Reservation {
    held: Held,
    bytes: usize,
}

impl Reservation {
    /// The bytes promised when it was made (the application's, plus the
    /// run's for a reservation for a run).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether it still holds its promise (a run may have taken it over).
    pub fn held(&self) -> bool {
        self.held.lock().is_some()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let ticket = self.held.lock().take();
        drop(ticket);
        // Forget it on this thread, if it is this thread's.
        let _ = FOR_RUN.try_with(|r| {
            let mut r = r.borrow_mut();
            if r.as_ref().is_some_and(|(_, h)| Arc::ptr_eq(h, &self.held)) {
                *r = None;
            }
        });
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("bytes", &self.bytes())
            .field("held", &self.held())
            .finish()
    }
}

impl Admission {
    /// Waits until `bytes` fit in what the limit has not promised to the
    /// runs in flight and to other reservations, then promises them to the
    /// caller until the [`Reservation`] is dropped. Without a limit it
    /// returns at once. The wait is first come, first served with the
    /// runs; 0 bytes never wait.
    ///
    /// # Errors
    /// [`OrtArenaError::OutOfMemory`] at once when `bytes` is more than
    /// the limit could ever give (the limit less what the rest of the
    /// processes holds), naming both.
    pub fn reserve(self: &Arc<Self>, bytes: usize) -> Result<Reservation, OrtArenaError> {
        Ok(Reservation {
            held: Arc::new(Mutex::new(Some(self.admit(bytes, false)?))),
            bytes,
        })
    }

    /// Admits a run of `need` bytes as [`Admission::admit`] does, taking
    /// over the reservation for a run this thread holds
    /// ([`Admission::reserve_for_run`]) when it covers the run (no wait),
    /// else giving it back first.
    pub(crate) fn admit_run(
        self: &Arc<Self>,
        need: usize,
        alone: bool,
    ) -> Result<Ticket, OrtArenaError> {
        let alone = alone && !self.is_unlimited();
        if let Some(held) = take_held_for_run(self) {
            if !alone && need <= held.need() {
                return Ok(held.keep(need));
            }
        }
        let ticket = self.admit(need, alone)?;
        if !alone {
            self.note_run(ticket.need());
        }
        Ok(ticket)
    }

    /// As [`Admission::reserve`], for `bytes` of the application's and the
    /// run this thread makes next: waits until `bytes` plus the largest
    /// need of a run admitted so far fit, and promises them. The thread's
    /// next run under this admission takes the promise over if it covers
    /// the run's need (what is left goes back at once, and the run does
    /// not wait again); otherwise that run gives it back and waits its
    /// turn. One reservation for a run per thread: a second replaces the
    /// first as the one a run takes (both hold their promise until
    /// dropped).
    ///
    /// Hold it from before the request allocates (its decode) until its
    /// first run has started: the request's memory outside the arenas and
    /// its run were admitted together, so a server never decodes more
    /// requests than their runs have room for.
    ///
    /// # Errors
    /// [`OrtArenaError::OutOfMemory`] at once when `bytes` alone is more
    /// than the limit could ever give. Where `bytes` fits but not with the
    /// run's part, only `bytes` is promised (the run then waits its turn).
    pub fn reserve_for_run(self: &Arc<Self>, bytes: usize) -> Result<Reservation, OrtArenaError> {
        let run = self.largest_run();
        let ticket = match self.admit(bytes.saturating_add(run), false) {
            Ok(t) => t,
            Err(OrtArenaError::OutOfMemory(_)) if run > 0 => self.admit(bytes, false)?,
            Err(e) => return Err(e),
        };
        let promised = ticket.need();
        let held: Held = Arc::new(Mutex::new(Some(ticket)));
        let at = Arc::as_ptr(self) as usize;
        let _ = FOR_RUN.try_with(|r| *r.borrow_mut() = Some((at, Arc::clone(&held))));
        Ok(Reservation {
            held,
            bytes: promised,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::time::Duration;
    use tensor_arena::Budget;

    #[test]
    fn a_reservation_holds_room_until_dropped() {
        let a = Admission::of_budget(Budget::new(100));
        let r = a.reserve(70).unwrap();
        assert_eq!(r.bytes(), 70);
        assert_eq!(a.stats().promised, 70);
        let started = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&started);
        let b = Arc::clone(&a);
        let t = std::thread::spawn(move || {
            let _second = b.reserve(50).unwrap();
            flag.store(true, SeqCst);
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !started.load(SeqCst),
            "a second reservation fitted beside the first"
        );
        drop(r);
        t.join().unwrap();
        assert!(started.load(SeqCst));
        assert_eq!(a.stats().promised, 0);
    }

    #[test]
    fn a_reservation_over_the_limit_is_refused_at_once() {
        let a = Admission::of_budget(Budget::new(100));
        let e = a.reserve(101).unwrap_err();
        assert!(matches!(e, OrtArenaError::OutOfMemory(_)), "{e}");
        assert!(e.to_string().contains("101"), "{e}");
        assert_eq!(a.reserve(0).unwrap().bytes(), 0);
        let unlimited = Admission::unlimited();
        let (x, y) = (
            unlimited.reserve(usize::MAX).unwrap(),
            unlimited.reserve(usize::MAX).unwrap(),
        );
        assert_eq!((x.bytes(), y.bytes()), (usize::MAX, usize::MAX));
        drop((x, y));
        assert_eq!(unlimited.stats().promised, 0);
    }

    /// A run of `need` bytes admitted and ended, so that the admission has
    /// seen a run that large.
    fn seen_run(a: &Arc<Admission>, need: usize) {
        drop(a.admit_run(need, false).unwrap());
        assert_eq!(a.largest_run(), need);
    }

    #[test]
    fn a_run_takes_over_the_reservation_for_it_and_gives_back_the_rest() {
        let a = Admission::of_budget(Budget::new(100));
        seen_run(&a, 60);
        let r = a.reserve_for_run(10).unwrap();
        assert_eq!((r.bytes(), a.stats().promised), (70, 70));
        let run = a.admit_run(40, false).unwrap();
        assert_eq!(a.stats().promised, 40, "the rest of the promise went back");
        assert!(!r.held(), "the run took it over");
        drop(r);
        assert_eq!(a.stats().promised, 40, "the run keeps its promise");
        drop(run);
        assert_eq!(a.stats().promised, 0);
        // A later run of the thread waits its turn as any other.
        let later = a.admit_run(30, false).unwrap();
        assert_eq!(a.stats().promised, 30);
        drop(later);
    }

    #[test]
    fn requests_are_admitted_with_their_runs() {
        // Two requests of 30 bytes each, whose runs need 60: with plain
        // reservations both would decode at once (60 of 100) and their
        // runs then wait on each other's decoded inputs.
        let a = Admission::of_budget(Budget::new(100));
        seen_run(&a, 60);
        let first = a.reserve_for_run(30).unwrap();
        let started = Arc::new(AtomicBool::new(false));
        let (b, flag) = (Arc::clone(&a), Arc::clone(&started));
        let t = std::thread::spawn(move || {
            let second = b.reserve_for_run(30).unwrap();
            flag.store(true, SeqCst);
            let run = b.admit_run(60, false).unwrap();
            drop((second, run));
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !started.load(SeqCst),
            "a second request fitted beside the first's run"
        );
        let run = a.admit_run(60, false).unwrap();
        assert_eq!(a.stats().promised, 60);
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !started.load(SeqCst),
            "a second request fitted beside a run of 60"
        );
        drop((first, run));
        t.join().unwrap();
        assert!(started.load(SeqCst));
        assert_eq!(a.stats().promised, 0);
    }

    #[test]
    fn a_run_it_does_not_cover_gives_it_back_and_waits_its_turn() {
        let a = Admission::of_budget(Budget::new(100));
        seen_run(&a, 20);
        let r = a.reserve_for_run(50).unwrap();
        assert_eq!(a.stats().promised, 70);
        // 80 beside the 70 held would not fit: given back first, it does.
        let run = a.admit_run(80, false).unwrap();
        assert!(!r.held());
        assert_eq!(a.stats().promised, 80);
        drop((run, r));
        // A run alone (a model's first) inside one does not wait on it.
        let r = a.reserve_for_run(50).unwrap();
        let alone = a.admit_run(100, true).unwrap();
        assert!(alone.alone() && !r.held());
        drop((alone, r));
        assert_eq!(a.stats().promised, 0);
        assert_eq!(a.stats().running, 0);
    }

    #[test]
    fn another_threads_reservation_is_not_taken() {
        let a = Admission::of_budget(Budget::new(100));
        seen_run(&a, 20);
        let r = a.reserve_for_run(10).unwrap();
        let b = Arc::clone(&a);
        std::thread::spawn(move || drop(b.admit_run(20, false).unwrap()))
            .join()
            .unwrap();
        assert!(r.held());
        // Nor one of another admission.
        let other = Admission::of_budget(Budget::new(100));
        drop(other.admit_run(5, false).unwrap());
        assert!(r.held());
        drop(r);
        assert_eq!(a.stats().promised, 0);
    }
}
