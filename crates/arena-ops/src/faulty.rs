//! [`Faulty`]: a memory layer around another that counts and checks every
//! call, keeps its own map of committed granules, and fails on demand.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;
use tensor_arena::memory::{MemoryError, MemoryOp, MemoryProps};
use tensor_arena::{HostMemory, Memory};

/// One reservation as [`Faulty`] sees it.
#[derive(Debug)]
struct Range {
    base: usize,
    len: usize,
    granule: usize,
    /// Committed granules, by index.
    committed: Vec<bool>,
    /// Granules decommitted and not written since: they must read as zero
    /// once committed again.
    zero: Vec<bool>,
    /// One past the highest granule committed since the reservation was
    /// made.
    high: usize,
}

/// What a [`Faulty`] layer has seen, shared with the test that made it.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Successful calls.
    pub reserves: u64,
    /// Releases.
    pub releases: u64,
    /// Commit calls, failed ones included.
    pub commits: u64,
    /// Decommit calls, failed ones included.
    pub decommits: u64,
    /// The next this many reserve or commit calls fail.
    pub fail_next: u64,
    ranges: Vec<Range>,
}

impl Ledger {
    /// Bytes committed now, over all reservations.
    pub fn committed(&self) -> usize {
        self.ranges
            .iter()
            .flat_map(|r| {
                r.committed
                    .iter()
                    .enumerate()
                    .filter(|(_, &c)| c)
                    .map(|(i, _)| r.granule.min(r.len - i * r.granule))
            })
            .sum()
    }

    /// Granules not committed now below the highest granule committed
    /// since their reservation was made: at least the granules an arena
    /// gave back inside what it holds committed (its holes), and more where
    /// it cut its committed top since (a layer cannot tell one from the
    /// other). 0 means no hole, for certain.
    pub fn uncommitted_below_high_mark(&self) -> usize {
        self.ranges
            .iter()
            .map(|r| r.committed[..r.high].iter().filter(|&&c| !c).count())
            .sum()
    }

    /// Base addresses of the reservations held now.
    pub fn bases(&self) -> Vec<usize> {
        self.ranges.iter().map(|r| r.base).collect()
    }

    /// Reservations held now.
    pub fn reservations(&self) -> usize {
        self.ranges.len()
    }

    /// Granules (as address ranges) committed now.
    pub fn committed_granules(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for r in &self.ranges {
            for (i, &c) in r.committed.iter().enumerate() {
                if c {
                    let at = i * r.granule;
                    out.push((r.base + at, r.granule.min(r.len - at)));
                }
            }
        }
        out
    }

    /// Granules wholly inside `addr..addr + len` that were decommitted and
    /// not written since (they must read as zero); marks every granule the
    /// range touches as written.
    pub fn take_zero_granules(&mut self, addr: usize, len: usize) -> Vec<(usize, usize)> {
        let mut zero = Vec::new();
        for r in &mut self.ranges {
            let granule = r.granule;
            for i in 0..r.zero.len() {
                let at = r.base + i * granule;
                if at < addr + len && addr < at + granule {
                    if r.zero[i] && addr <= at && at + granule <= addr + len {
                        zero.push((at, granule));
                    }
                    r.zero[i] = false;
                }
            }
        }
        zero
    }
}

/// A memory layer around `M` that checks the arena's promises on every call
/// (granule-aligned ranges inside a live reservation; commit only what is
/// not committed, decommit only what is; release once), records them in a
/// [`Ledger`], and makes reserve and commit calls fail on demand.
#[derive(Debug)]
pub struct Faulty<M> {
    inner: M,
    ledger: Rc<RefCell<Ledger>>,
}

impl<M: Memory<Ptr = NonNull<u8>>> Faulty<M> {
    /// Wraps `inner`; the returned ledger sees every call.
    pub fn new(inner: M) -> (Self, Rc<RefCell<Ledger>>) {
        let ledger = Rc::new(RefCell::new(Ledger::default()));
        (
            Self {
                inner,
                ledger: Rc::clone(&ledger),
            },
            ledger,
        )
    }

    fn granule(&self) -> usize {
        self.inner.props().granule
    }

    fn fail(&self, op: MemoryOp, bytes: usize) -> Result<(), MemoryError> {
        let mut l = self.ledger.borrow_mut();
        if l.fail_next > 0 {
            l.fail_next -= 1;
            return Err(MemoryError {
                op,
                bytes,
                code: None,
            });
        }
        Ok(())
    }

    /// The granule indices of `offset..offset + len` in the range at
    /// `base`, after checking the arena's promises.
    fn granules(&self, base: NonNull<u8>, offset: usize, len: usize) -> (usize, usize, usize) {
        let g = self.granule();
        let l = self.ledger.borrow();
        let i = l
            .ranges
            .iter()
            .position(|r| r.base == base.as_ptr() as usize)
            .expect("a call on a range that is not reserved");
        let r = &l.ranges[i];
        assert!(len > 0, "an empty commit or decommit");
        assert!(
            offset % g == 0 && (len % g == 0 || offset + len == r.len),
            "{offset:#x}+{len:#x} is not granule-aligned"
        );
        assert!(offset + len <= r.len, "{offset:#x}+{len:#x} past the range");
        (i, offset / g, (offset + len).div_ceil(g))
    }
}

impl<M: Memory<Ptr = NonNull<u8>>> Memory for Faulty<M> {
    type Ptr = NonNull<u8>;

    fn props(&self) -> MemoryProps {
        self.inner.props()
    }

    fn reservation_size(&self, min: usize, cap: usize) -> usize {
        self.inner.reservation_size(min, cap)
    }

    fn reserve(&mut self, len: usize, align: usize) -> Result<NonNull<u8>, MemoryError> {
        self.fail(MemoryOp::Reserve, len)?;
        let base = self.inner.reserve(len, align)?;
        let n = len.div_ceil(self.granule());
        let mut l = self.ledger.borrow_mut();
        l.reserves += 1;
        let committed = self.inner.props().committed_on_reserve;
        let granule = self.granule();
        l.ranges.push(Range {
            base: base.as_ptr() as usize,
            len,
            granule,
            committed: vec![committed; n],
            zero: vec![true; n],
            high: if committed { n } else { 0 },
        });
        Ok(base)
    }

    fn commit(&mut self, base: NonNull<u8>, offset: usize, len: usize) -> Result<(), MemoryError> {
        let (i, lo, hi) = self.granules(base, offset, len);
        // Calls are counted as the arena counts them: failed ones too.
        self.ledger.borrow_mut().commits += 1;
        self.fail(MemoryOp::Commit, len)?;
        self.inner.commit(base, offset, len)?;
        let mut l = self.ledger.borrow_mut();
        let r = &mut l.ranges[i];
        for c in &mut r.committed[lo..hi] {
            assert!(!*c, "a granule committed twice");
            *c = true;
        }
        r.high = r.high.max(hi);
        Ok(())
    }

    fn decommit(
        &mut self,
        base: NonNull<u8>,
        offset: usize,
        len: usize,
    ) -> Result<(), MemoryError> {
        let (i, lo, hi) = self.granules(base, offset, len);
        self.ledger.borrow_mut().decommits += 1;
        self.inner.decommit(base, offset, len)?;
        let mut l = self.ledger.borrow_mut();
        let r = &mut l.ranges[i];
        for g in lo..hi {
            assert!(
                r.committed[g],
                "a granule decommitted that was not committed"
            );
            r.committed[g] = false;
            r.zero[g] = true;
        }
        Ok(())
    }

    fn release(&mut self, base: NonNull<u8>, len: usize, align: usize) {
        {
            let mut l = self.ledger.borrow_mut();
            let i = l
                .ranges
                .iter()
                .position(|r| r.base == base.as_ptr() as usize && r.len == len)
                .expect("release of a range that is not reserved");
            l.ranges.swap_remove(i);
            l.releases += 1;
        }
        self.inner.release(base, len, align);
    }

    fn lazily_given_back(&self) -> usize {
        self.inner.lazily_given_back()
    }

    fn slow_huge_commits(&self) -> u64 {
        self.inner.slow_huge_commits()
    }

    fn give_back_now(&mut self) -> usize {
        // Decommitted granules stay decommitted (the ledger has them so).
        self.inner.give_back_now()
    }

    fn at(base: NonNull<u8>, offset: usize) -> NonNull<u8> {
        M::at(base, offset)
    }

    fn address(ptr: NonNull<u8>) -> usize {
        M::address(ptr)
    }
}

// SAFETY: every call goes to `inner` unchanged (a refused call changes
// nothing), so the ranges, their commits and their addresses are exactly
// `inner`'s, which is a `HostMemory`.
unsafe impl<M: HostMemory> HostMemory for Faulty<M> {}
