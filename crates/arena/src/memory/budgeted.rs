//! [`Budgeted`]: any memory layer, its commits charged to a [`Budget`].

use super::{ErrorCode, HostMemory, Memory, MemoryError, MemoryOp, MemoryProps};
use crate::budget::Budget;
use std::sync::Arc;

/// A memory layer whose commits are charged to a shared [`Budget`]: a
/// commit (or, for a layer that commits on reserve, a reservation) is
/// charged before the layer is asked, and refused with
/// [`ErrorCode::OverBudget`] if the budget cannot make room; decommits and
/// releases credit it. Everything else is the inner layer's.
#[derive(Debug)]
pub struct Budgeted<M: Memory> {
    inner: M,
    budget: Arc<Budget>,
    /// Committed bytes of each live range, by its address: what its release
    /// credits.
    ranges: Vec<(usize, usize)>,
}

impl<M: Memory> Budgeted<M> {
    /// `inner`, charged to `budget`.
    pub fn new(inner: M, budget: Arc<Budget>) -> Self {
        Self {
            inner,
            budget,
            ranges: Vec::new(),
        }
    }

    /// The budget.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// The inner layer.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    fn charge(&self, op: MemoryOp, bytes: usize) -> Result<(), MemoryError> {
        if self.budget.charge(bytes) {
            Ok(())
        } else {
            Err(MemoryError {
                op,
                bytes,
                code: Some(ErrorCode::OverBudget {
                    limit: self.budget.limit(),
                }),
            })
        }
    }

    fn range(&mut self, base: M::Ptr) -> Option<&mut usize> {
        let at = M::address(base);
        self.ranges.iter_mut().find(|r| r.0 == at).map(|r| &mut r.1)
    }
}

impl<M: Memory> Memory for Budgeted<M> {
    type Ptr = M::Ptr;

    fn props(&self) -> MemoryProps {
        self.inner.props()
    }

    fn reservation_size(&self, min: usize, cap: usize) -> usize {
        self.inner.reservation_size(min, cap)
    }

    fn reserve(&mut self, len: usize, align: usize) -> Result<M::Ptr, MemoryError> {
        let committed = if self.inner.props().committed_on_reserve {
            len
        } else {
            0
        };
        self.charge(MemoryOp::Reserve, committed)?;
        match self.inner.reserve(len, align) {
            Ok(base) => {
                self.ranges.push((M::address(base), committed));
                Ok(base)
            }
            Err(e) => {
                self.budget.credit(committed);
                Err(e)
            }
        }
    }

    fn commit(&mut self, base: M::Ptr, offset: usize, len: usize) -> Result<(), MemoryError> {
        if self.inner.props().committed_on_reserve {
            return self.inner.commit(base, offset, len);
        }
        self.charge(MemoryOp::Commit, len)?;
        match self.inner.commit(base, offset, len) {
            Ok(()) => {
                if let Some(c) = self.range(base) {
                    *c += len;
                }
                Ok(())
            }
            Err(e) => {
                self.budget.credit(len);
                Err(e)
            }
        }
    }

    fn decommit(&mut self, base: M::Ptr, offset: usize, len: usize) -> Result<(), MemoryError> {
        self.inner.decommit(base, offset, len)?;
        if !self.inner.props().committed_on_reserve {
            if let Some(c) = self.range(base) {
                let n = len.min(*c);
                *c -= n;
                self.budget.credit(n);
            }
        }
        Ok(())
    }

    fn release(&mut self, base: M::Ptr, len: usize, align: usize) {
        let at = M::address(base);
        if let Some(i) = self.ranges.iter().position(|r| r.0 == at) {
            let (_, committed) = self.ranges.swap_remove(i);
            self.budget.credit(committed);
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
        // Charged nothing: the budget was credited at the decommit.
        self.inner.give_back_now()
    }

    fn at(base: M::Ptr, offset: usize) -> M::Ptr {
        M::at(base, offset)
    }

    fn address(ptr: M::Ptr) -> usize {
        M::address(ptr)
    }
}

impl<M: Memory> Drop for Budgeted<M> {
    fn drop(&mut self) {
        // The arena releases every range before its layer goes; whatever a
        // failed release left is credited so the budget stays exact.
        for (_, committed) in self.ranges.drain(..) {
            self.budget.credit(committed);
        }
    }
}

// SAFETY: every call is forwarded to `inner` with the same arguments, and
// `at` is `inner`'s: the ranges, their addresses, what is committed and the
// provenance of addresses are exactly `inner`'s, which upholds
// `HostMemory` (the bound). A refused charge only makes `commit` or
// `reserve` fail before `inner` is asked, which the contract allows.
unsafe impl<M: HostMemory> HostMemory for Budgeted<M> {}
