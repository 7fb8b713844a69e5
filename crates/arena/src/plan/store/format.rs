//! The store's file format: a fixed header, then a checksummed body of
//! little-endian integers and length-prefixed byte strings.
//!
//! ```text
//! header (32 bytes)
//!   magic     8   b"TAPLANS\0"
//!   version   u32 FORMAT_VERSION
//!   reserved  u32 0
//!   body_len  u64 bytes after the header (the file is exactly this long)
//!   checksum  u64 hash64 of the body
//! body
//!   model key     model u64, runtime bytes, options bytes
//!   key kind      bytes (PlanKey::KIND of the keys below)
//!   family probe  u64 (how this build hashes family ids)
//!   plans         u32 n, then n times:
//!                   key bytes, blocks u32 b, (size u64, align u64) * b,
//!                   events u32 e, event u32 * e, offset u64 * b,
//!                   size u64, align u64, lower_bound u64,
//!                   flags u32 (bit 0: workspaces apart; version 2 on)
//!   families      u32 n, then n times:
//!                   id u64, name bytes, structures u32 s, then s times:
//!                     blocks u32 b, align u64 * b, events u32 e, event u32 * e,
//!                     shapes u32 k, then k times:
//!                       dims u32 d, u64 * d, size u64 * b, lower_bound u64
//! bytes = u32 length, then the bytes; event = block index, top bit set for
//! a free.
//! ```
//!
//! Reading never trusts a length: each is checked against the bytes left
//! before anything is allocated for it.

use super::check::hash64;
use super::merge::{MAX_FAMILIES, MAX_PLANS, MAX_SHAPES, MAX_STRUCTURES};
use super::snapshot::{FamilySnapshot, ShapeSnapshot, StructureSnapshot};
use super::{ModelKey, StoreError};
use crate::plan::{Plan, PlanError, PlanEvent, Recording, Source};
use std::collections::VecDeque;

/// The file's first bytes.
pub(crate) const MAGIC: [u8; 8] = *b"TAPLANS\0";
/// The format's version, the one a save writes. A file of an older
/// version this build still reads ([`OLDEST_VERSION`] on) is loaded and
/// rewritten in this one by the next save; a file of any other version is
/// refused (and replaced by the next save).
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build reads: version 1 has no plan
/// flags (its plans are read as plans of whole runs).
pub const OLDEST_VERSION: u32 = 1;
/// A plan's flag: runs on it serve their workspaces beside it
/// ([`Plan::workspaces_apart`]).
const APART: u32 = 1;
/// Bytes of the header.
pub(crate) const HEADER: usize = 32;
/// Top bit of an event: a free.
const FREE: u32 = 1 << 31;

/// What a file holds, decoded but not yet checked against the model's key.
pub(crate) struct Body {
    pub(crate) key: ModelKey,
    pub(crate) kind: String,
    pub(crate) probe: u64,
    /// Each plan's key bytes and its plan, valid.
    pub(crate) plans: Vec<(Vec<u8>, Plan)>,
    pub(crate) families: Vec<FamilySnapshot>,
}

/// The file for `body`'s parts: header and body. Plans or structures with
/// a block index that does not fit an event's 31 bits (no real run has
/// 2^31 blocks) are left out. The file's bytes are counted first and
/// written into one buffer of that size (a save holds the file once, not
/// a growing buffer and its copy), straight from each plan's tape.
pub(crate) fn encode(
    key: &ModelKey,
    kind: &str,
    probe: u64,
    plans: &[(Vec<u8>, &Plan)],
    families: &[FamilySnapshot],
) -> Vec<u8> {
    let plans: Vec<&(Vec<u8>, &Plan)> = plans.iter().filter(|(_, p)| fits(p)).collect();
    let mut len = HEADER + 8 + 4 + key.runtime.len() + 4 + key.options.len();
    len += 4 + kind.len() + 8 + 4;
    for (k, p) in &plans {
        len += 4 + k.len() + 4 + 24 * p.len() + 4 + 4 * p.event_count() + 28;
    }
    len += 4;
    for f in families {
        len += 8 + 4 + f.name.len() + 4;
        for s in structures(f) {
            len += 4 + 8 * s.aligns.len() + 4 + 4 * s.events.len() + 4;
            for shape in &s.shapes {
                len += 4 + 8 * shape.dims.len() + 8 * s.aligns.len() + 8;
            }
        }
    }
    let mut w = Vec::with_capacity(len);
    w.extend_from_slice(&[0; HEADER]);
    put_u64(&mut w, key.model);
    put_bytes(&mut w, key.runtime.as_bytes());
    put_bytes(&mut w, key.options.as_bytes());
    put_bytes(&mut w, kind.as_bytes());
    put_u64(&mut w, probe);
    put_len(&mut w, plans.len());
    for (k, plan) in plans {
        put_bytes(&mut w, k);
        put_len(&mut w, plan.len());
        for i in 0..plan.len() {
            let (size, align) = plan.block(i).unwrap_or((0, 0));
            put_u64(&mut w, size as u64);
            put_u64(&mut w, align as u64);
        }
        put_len(&mut w, plan.event_count());
        for step in plan.steps() {
            let c = if step.is_free() {
                step.index | FREE
            } else {
                step.index
            };
            w.extend_from_slice(&c.to_le_bytes());
        }
        for i in 0..plan.len() {
            put_u64(&mut w, plan.offset(i).unwrap_or(0) as u64);
        }
        put_u64(&mut w, plan.size() as u64);
        put_u64(&mut w, plan.align() as u64);
        put_u64(&mut w, plan.lower_bound() as u64);
        let flags = if plan.workspaces_apart() { APART } else { 0 };
        w.extend_from_slice(&flags.to_le_bytes());
    }
    put_len(&mut w, families.len());
    for f in families {
        put_u64(&mut w, f.id);
        put_bytes(&mut w, f.name.as_bytes());
        put_len(&mut w, structures(f).count());
        for s in structures(f) {
            put_len(&mut w, s.aligns.len());
            for &a in &s.aligns {
                put_u64(&mut w, a as u64);
            }
            put_len(&mut w, s.events.len());
            for c in s.events.iter().filter_map(|ev| code(*ev)) {
                w.extend_from_slice(&c.to_le_bytes());
            }
            put_len(&mut w, s.shapes.len());
            for shape in &s.shapes {
                put_len(&mut w, shape.dims.len());
                for &d in &shape.dims {
                    put_u64(&mut w, d);
                }
                // As many sizes as blocks, whatever the snapshot held.
                for i in 0..s.aligns.len() {
                    put_u64(&mut w, shape.sizes.get(i).copied().unwrap_or(0) as u64);
                }
                put_u64(&mut w, shape.lower_bound as u64);
            }
        }
    }
    debug_assert_eq!(w.len(), len, "the file's bytes as counted");
    let body_len = (w.len() - HEADER) as u64;
    let checksum = hash64(&w[HEADER..]);
    w[0..8].copy_from_slice(&MAGIC);
    w[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    w[16..24].copy_from_slice(&body_len.to_le_bytes());
    w[24..32].copy_from_slice(&checksum.to_le_bytes());
    w
}

fn put_u64(w: &mut Vec<u8>, v: u64) {
    w.extend_from_slice(&v.to_le_bytes());
}

fn put_len(w: &mut Vec<u8>, n: usize) {
    // Counts past u32 cannot be written; nothing the cache holds has them.
    w.extend_from_slice(&(n.min(u32::MAX as usize) as u32).to_le_bytes());
}

fn put_bytes(w: &mut Vec<u8>, b: &[u8]) {
    let b = &b[..b.len().min(u32::MAX as usize)];
    put_len(w, b.len());
    w.extend_from_slice(b);
}

/// Whether every block index of `plan` fits an event's 31 bits (and its
/// counts a `u32`).
fn fits(plan: &Plan) -> bool {
    plan.len() <= FREE as usize && plan.event_count() <= u32::MAX as usize
}

/// A family's structures whose events all have a code.
fn structures(f: &FamilySnapshot) -> impl Iterator<Item = &StructureSnapshot> {
    f.structures
        .iter()
        .filter(|s| s.events.iter().all(|ev| code(*ev).is_some()))
}

/// An event's code, or `None` where its index does not fit 31 bits.
fn code(ev: PlanEvent) -> Option<u32> {
    match ev {
        PlanEvent::Alloc(i) if i < FREE => Some(i),
        PlanEvent::Free(i) if i < FREE => Some(i | FREE),
        _ => None,
    }
}

/// Checks the header and checksum of `file` and decodes its body; every
/// plan passes [`Plan::validate`] (through [`Plan::from_parts`]) and every
/// shape's recording [`Recording::validate`], with its lower bound its
/// recording's.
pub(crate) fn decode(file: &[u8]) -> Result<Body, StoreError> {
    decode_except(file, &|_| false)
}

/// [`decode`], but the plans whose key `skip` says are read past, neither
/// built nor checked (a save's: the keys it holds, whose file side the
/// merge drops anyway).
pub(crate) fn decode_except(file: &[u8], skip: &dyn Fn(&[u8]) -> bool) -> Result<Body, StoreError> {
    if file.is_empty() {
        return Err(StoreError::Empty);
    }
    if file.len() < HEADER {
        return Err(if MAGIC.starts_with(file) {
            StoreError::Truncated
        } else {
            StoreError::Foreign
        });
    }
    if file[0..8] != MAGIC {
        return Err(StoreError::Foreign);
    }
    let version = u32::from_le_bytes(file[8..12].try_into().expect("4 bytes"));
    if !(OLDEST_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(StoreError::Version(version));
    }
    if file[12..16] != [0; 4] {
        return Err(StoreError::malformed("reserved header bytes are not zero"));
    }
    let body_len = u64::from_le_bytes(file[16..24].try_into().expect("8 bytes"));
    let checksum = u64::from_le_bytes(file[24..32].try_into().expect("8 bytes"));
    let body = &file[HEADER..];
    if (body.len() as u64) < body_len {
        return Err(StoreError::Truncated);
    }
    if body.len() as u64 != body_len || hash64(body) != checksum {
        return Err(StoreError::Checksum);
    }
    let mut r = Reader { b: body, version };
    let key = ModelKey {
        model: r.u64()?,
        runtime: r.string()?,
        options: r.string()?,
    };
    let kind = r.string()?;
    let probe = r.u64()?;
    // Each item is checked as it is decoded, and only the most recent
    // (the last) within the bounds are kept: memory follows what is kept,
    // not what the file claims. A plan is at least 36 bytes (its key's and
    // counts' lengths and its size, align and lower bound).
    let n = r.count(36)?;
    let mut plans = VecDeque::with_capacity(n.min(MAX_PLANS));
    for _ in 0..n {
        let k = r.bytes()?;
        if skip(k) {
            r.skip_plan()?;
            continue;
        }
        let plan = r.plan()?;
        if plans.len() == MAX_PLANS {
            plans.pop_front();
        }
        plans.push_back((k.to_vec(), plan));
    }
    let plans = Vec::from(plans);
    let n = r.count(16)?;
    let mut families = VecDeque::with_capacity(n.min(MAX_FAMILIES));
    for _ in 0..n {
        let f = r.family()?;
        if families.len() == MAX_FAMILIES {
            families.pop_front();
        }
        families.push_back(f);
    }
    let families = Vec::from(families);
    if !r.b.is_empty() {
        return Err(StoreError::malformed(format!(
            "{} bytes after the last family",
            r.b.len()
        )));
    }
    Ok(Body {
        key,
        kind,
        probe,
        plans,
        families,
    })
}

/// Reads the body front to back; every read checks the bytes left.
struct Reader<'a> {
    b: &'a [u8],
    /// The file's format version (what a plan's record holds).
    version: u32,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if n > self.b.len() {
            return Err(StoreError::malformed("a length past the end of the body"));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, StoreError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }

    fn usize(&mut self) -> Result<usize, StoreError> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| StoreError::malformed(format!("{v} is not a size here")))
    }

    /// A count of items of at least `each` bytes: refused if the bytes
    /// left cannot hold that many, so that nothing is allocated for a
    /// length a file only claims.
    fn count(&mut self, each: usize) -> Result<usize, StoreError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(each) > self.b.len() {
            return Err(StoreError::malformed(format!(
                "{n} items of {each}+ bytes in {} bytes left",
                self.b.len()
            )));
        }
        Ok(n)
    }

    fn bytes(&mut self) -> Result<&'a [u8], StoreError> {
        let n = self.count(1)?;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, StoreError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| StoreError::malformed("text that is not UTF-8"))
    }

    /// `n` sizes (`count` checked that the bytes are there).
    fn usizes(&mut self, n: usize) -> Result<Vec<usize>, StoreError> {
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.usize()?);
        }
        Ok(v)
    }

    fn events(&mut self) -> Result<Vec<PlanEvent>, StoreError> {
        let n = self.count(4)?;
        let mut v = Vec::with_capacity(n);
        for c in self.take(4 * n)?.chunks_exact(4) {
            let c = u32::from_le_bytes(c.try_into().expect("4"));
            v.push(if c & FREE != 0 {
                PlanEvent::Free(c & !FREE)
            } else {
                PlanEvent::Alloc(c)
            });
        }
        Ok(v)
    }

    /// Reads past a plan, building nothing.
    fn skip_plan(&mut self) -> Result<(), StoreError> {
        let n = self.count(16)?;
        self.take(16 * n)?;
        let e = self.count(4)?;
        self.take(4 * e)?;
        let offsets = n
            .checked_mul(8)
            .ok_or_else(|| StoreError::malformed("a plan's offsets past the end"))?;
        self.take(offsets)?;
        self.take(24)?;
        self.flags()?;
        Ok(())
    }

    /// A plan, built straight from the file's bytes into its tape (no
    /// recording or offsets beside it) and checked.
    fn plan(&mut self) -> Result<Plan, StoreError> {
        let n = self.count(16)?;
        let blocks = self.take(16 * n)?;
        let e = self.count(4)?;
        let events = self.take(4 * e)?;
        let offsets = n
            .checked_mul(8)
            .ok_or_else(|| StoreError::malformed("a plan's offsets past the end"))?;
        let offsets = self
            .take(offsets)
            .map_err(|_| StoreError::malformed("a plan's offsets past the end"))?;
        let (size, align, lower_bound) = (self.usize()?, self.usize()?, self.usize()?);
        let flags = self.flags()?;
        let word = |b: &[u8], at: usize| {
            let v = u64::from_le_bytes(b[8 * at..8 * at + 8].try_into().expect("8"));
            usize::try_from(v).map_err(|_| PlanError::new(format!("{v} is not a size here")))
        };
        Plan::build(Source {
            blocks: n,
            block: |i| Ok((word(blocks, 2 * i)?, word(blocks, 2 * i + 1)?)),
            offset: |i| word(offsets, i),
            events: events.chunks_exact(4).map(|c| {
                let c = u32::from_le_bytes(c.try_into().expect("4"));
                if c & FREE != 0 {
                    PlanEvent::Free(c & !FREE)
                } else {
                    PlanEvent::Alloc(c)
                }
            }),
            event_count: e,
            size,
            align,
            lower_bound: Some(lower_bound),
        })
        .map(|plan| {
            if flags & APART != 0 {
                plan.with_workspaces_apart()
            } else {
                plan
            }
        })
        .map_err(StoreError::Invalid)
    }

    /// A plan's flags: none before version 2; a flag this build does not
    /// know is refused (a later format bumps the version instead).
    fn flags(&mut self) -> Result<u32, StoreError> {
        if self.version < 2 {
            return Ok(0);
        }
        let flags = self.u32()?;
        if flags & !APART != 0 {
            return Err(StoreError::malformed(format!("a plan's flags {flags:#x}")));
        }
        Ok(flags)
    }

    fn family(&mut self) -> Result<FamilySnapshot, StoreError> {
        let id = self.u64()?;
        let name = self.string()?;
        let n = self.count(12)?;
        let mut structures = VecDeque::with_capacity(n.min(MAX_STRUCTURES));
        for _ in 0..n {
            let s = self.structure()?;
            if structures.len() == MAX_STRUCTURES {
                structures.pop_front();
            }
            structures.push_back(s);
        }
        let structures = Vec::from(structures);
        Ok(FamilySnapshot {
            id,
            name,
            structures,
        })
    }

    fn structure(&mut self) -> Result<StructureSnapshot, StoreError> {
        let b = self.count(8)?;
        let aligns = self.usizes(b)?;
        let mut s = StructureSnapshot {
            events: self.events()?,
            aligns,
            shapes: Vec::new(),
        };
        let n = self.count(12)?;
        let mut shapes = VecDeque::with_capacity(n.min(MAX_SHAPES));
        // One recording, its sizes replaced shape by shape: no copy of
        // the events per shape.
        let mut rec = Recording {
            blocks: Vec::with_capacity(b),
            events: std::mem::take(&mut s.events),
        };
        for _ in 0..n {
            let d = self.count(8)?;
            if d > super::MAX_DIMS {
                return Err(StoreError::malformed(format!(
                    "a shape of {d} dimensions (at most {})",
                    super::MAX_DIMS
                )));
            }
            let dims = (0..d).map(|_| self.u64()).collect::<Result<Vec<_>, _>>()?;
            if b.saturating_mul(8) > self.b.len() {
                return Err(StoreError::malformed("a shape's sizes past the end"));
            }
            let sizes = self.usizes(b)?;
            let shape = ShapeSnapshot {
                dims,
                sizes,
                lower_bound: self.usize()?,
            };
            rec.blocks.clear();
            rec.blocks
                .extend(shape.sizes.iter().copied().zip(s.aligns.iter().copied()));
            rec.validate().map_err(StoreError::Invalid)?;
            let lower_bound = rec.peak_live();
            if shape.lower_bound != lower_bound {
                return Err(StoreError::malformed(format!(
                    "a shape's lower bound {} but its recording's is {lower_bound}",
                    shape.lower_bound
                )));
            }
            if shapes.len() == MAX_SHAPES {
                shapes.pop_front();
            }
            shapes.push_back(shape);
        }
        s.events = rec.events;
        s.shapes = Vec::from(shapes);
        Ok(s)
    }
}
