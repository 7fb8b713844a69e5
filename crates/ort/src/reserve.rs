//! Room the application asks for under the memory limit, beside the runs:
//! a decoded image, a preprocessing buffer, anything the arenas cannot see.

use crate::admit::{Admission, Ticket};
use crate::OrtArenaError;
use std::sync::Arc;

/// Bytes promised to the application under an [`Admission`]'s limit, given
/// back when dropped ([`Admission::reserve`]).
///
/// Hold one around work that allocates outside the arenas (decoding a
/// request's image, say) and end it before the request's runs: a
/// reservation waits its turn with the runs (first come, first served),
/// counts with them against the limit while held, and the room it leaves
/// is the limit less what the rest of every process holds. Holding one
/// while a run of the same thread waits for admission can wait on itself
/// under a tight limit: end it first.
pub struct Reservation {
    _ticket: Ticket,
    bytes: usize,
}

impl Reservation {
    /// The bytes promised.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("bytes", &self.bytes())
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
            _ticket: self.admit(bytes, false)?,
            bytes,
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
}
