//! What a store is keyed by ([`ModelKey`]) and how a cache's run keys are
//! written to it ([`PlanKey`]).

use super::check::hash64;

/// What a store's plans belong to: everything that changes the sequence
/// of allocations a model's runs make.
///
/// - `model`: a hash of the model's bytes ([`ModelKey::hash_model`]): an
///   edited model allocates otherwise.
/// - `runtime`: the runtime's name and version (ONNX Runtime 1.22 and
///   1.23 may fuse other nodes).
/// - `options`: every session option that changes the order or sizes of
///   allocations, written as one text by the caller (for ONNX Runtime:
///   intra- and inter-op threads, graph optimization level, execution
///   mode, execution providers); options that do not (logging, names)
///   are best left out, so that they do not split the store.
///
/// A store file whose key is not equal to the loading process's is not
/// loaded (one warning says which part differs); the next save replaces
/// it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ModelKey {
    /// Hash of the model's bytes.
    pub model: u64,
    /// The runtime's name and version.
    pub runtime: String,
    /// The options that change the allocation sequence, as text.
    pub options: String,
}

impl ModelKey {
    /// The key of the model whose bytes are `model`, under `runtime`,
    /// with `options`.
    pub fn new(model: &[u8], runtime: impl Into<String>, options: impl Into<String>) -> Self {
        Self {
            model: Self::hash_model(model),
            runtime: runtime.into(),
            options: options.into(),
        }
    }

    /// The hash of a model's bytes the key holds (64 bits, a few GB/s:
    /// it tells models apart, it does not authenticate them).
    pub fn hash_model(model: &[u8]) -> u64 {
        hash64(model)
    }

    /// The store file's name for this key: the model's hash, then a hash
    /// of the runtime and the options, so that one directory holds one
    /// file per whole key (two option sets of one model, or two runtime
    /// versions, keep a file each instead of replacing each other's).
    pub fn file_name(&self) -> String {
        let mut rest = Vec::with_capacity(self.runtime.len() + self.options.len() + 9);
        rest.extend_from_slice(&(self.runtime.len() as u64).to_le_bytes());
        rest.extend_from_slice(self.runtime.as_bytes());
        rest.extend_from_slice(self.options.as_bytes());
        format!("{:016x}-{:016x}.plans", self.model, hash64(&rest))
    }

    /// Why a file keyed `saved` is not this key's, in words; `None` when
    /// they are equal.
    pub(crate) fn mismatch(&self, saved: &ModelKey) -> Option<String> {
        if saved.model != self.model {
            Some(format!(
                "it is another model's (model hash {:016x}, not {:016x})",
                saved.model, self.model
            ))
        } else if saved.runtime != self.runtime {
            Some(format!(
                "it was saved by runtime {:?}, this is {:?}",
                saved.runtime, self.runtime
            ))
        } else if saved.options != self.options {
            Some(format!(
                "it was saved with options {:?}, these are {:?}",
                saved.options, self.options
            ))
        } else {
            None
        }
    }
}

/// A run key a store can write and read back.
///
/// Decoding must accept exactly what encoding writes; any other bytes may
/// come from a file and return `None` (the file is then refused).
pub trait PlanKey: Sized {
    /// The kind of key, written in the file: a file of another kind is
    /// refused.
    const KIND: &'static str;
    /// Appends the key's bytes to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// The key written as `bytes`, if they are one.
    fn decode(bytes: &[u8]) -> Option<Self>;
}

/// Text keys (a trace's labels): their UTF-8 bytes.
impl PlanKey for String {
    const KIND: &'static str = "text";
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_bytes());
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }
}

/// Byte keys: the bytes (the same kind as text keys: both are keyed as
/// text by [`KeyDims`](crate::KeyDims)).
impl PlanKey for Vec<u8> {
    const KIND: &'static str = "text";
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        Some(bytes.to_vec())
    }
}

/// Keys of numbers (shapes): each as a little-endian `u64`.
impl PlanKey for Vec<usize> {
    const KIND: &'static str = "dims";
    fn encode(&self, out: &mut Vec<u8>) {
        encode_dims(self, out);
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        decode_dims(bytes)
    }
}

/// Keys of numbers, boxed: as `Vec<usize>`.
impl PlanKey for Box<[usize]> {
    const KIND: &'static str = "dims";
    fn encode(&self, out: &mut Vec<u8>) {
        encode_dims(self, out);
    }
    fn decode(bytes: &[u8]) -> Option<Self> {
        decode_dims(bytes).map(Vec::into_boxed_slice)
    }
}

/// Writes numbers as `PlanKey for Vec<usize>` does (for key types made of
/// numbers, such as `crates/ort`'s `RunKey`).
pub fn encode_dims(dims: &[usize], out: &mut Vec<u8>) {
    for &d in dims {
        out.extend_from_slice(&(d as u64).to_le_bytes());
    }
}

/// Reads what [`encode_dims`] wrote.
pub fn decode_dims(bytes: &[u8]) -> Option<Vec<usize>> {
    if bytes.len() % 8 != 0 {
        return None;
    }
    bytes
        .chunks_exact(8)
        .map(|c| usize::try_from(u64::from_le_bytes(c.try_into().ok()?)).ok())
        .collect()
}
