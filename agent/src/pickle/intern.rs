//! Hash-consing of container contents: a list or tuple whose items equal those of one read
//! before keeps one copy of them in the [`PickleDoc`](super::PickleDoc), however many containers
//! hold them. PyTorch's snapshots write every traceback as a list object of its own, while most
//! tracebacks repeat (each iteration of a training loop allocates from the same lines), so a
//! snapshot with 10^6 trace entries holds 10^6 frame lists of 30 to 60 items but only thousands
//! of distinct ones; keeping their items once is most of the reader's memory. The containers
//! stay distinct objects ([`ContainerId`](super::ContainerId)s differ): only their storage is
//! shared, and a container whose items change later (`APPEND`) first gets its own copy.
//!
//! One table slot per content hash (rustc's `FxHasher`, from the `rustc-hash` crate, over one
//! word per value, its bits with its tag in the top bits): a second content with the same
//! hash is simply not shared, so crafted collisions cost nothing but the sharing. Equality is bitwise per value (`0.0` and
//! `-0.0` differ, a NaN equals the same NaN), so sharing never changes a value.

use super::value::PickleValue;

/// Identifies one shared run of items in a [`PickleDoc`](super::PickleDoc).
pub type SharedId = u32;

/// Where a value's tag goes in its hash word: the top four bits.
const TAG_SHIFT: u32 = 4;

/// A value as two words: its tag and its bits. Equal words mean the same Python value.
#[inline]
fn words(v: &PickleValue) -> (u64, u64) {
    match *v {
        PickleValue::None => (0, 0),
        PickleValue::Bool(b) => (1, b as u64),
        PickleValue::Int(i) => (2, i as u64),
        PickleValue::BigInt(b) => (3, b.0 as u64),
        PickleValue::Float(f) => (4, f.to_bits()),
        PickleValue::Str(s) => (5, s.0 as u64),
        PickleValue::Bytes(b) => (6, b.0 as u64),
        PickleValue::List(c) => (7, c.0 as u64),
        PickleValue::Tuple(c) => (8, c.0 as u64),
        PickleValue::Dict(c) => (9, c.0 as u64),
        PickleValue::Set(c) => (10, c.0 as u64),
        PickleValue::FrozenSet(c) => (11, c.0 as u64),
    }
}

/// The content hash of `items`.
fn hash(items: &[PickleValue]) -> u64 {
    use std::hash::Hasher as _;
    let mut h = rustc_hash::FxHasher::default();
    h.write_usize(items.len());
    for v in items {
        let (tag, bits) = words(v);
        // One word per value: the tag in the top bits (a collision only costs sharing).
        h.write_u64(bits ^ tag.rotate_right(TAG_SHIFT));
    }
    h.finish()
}

/// Whether `a` and `b` hold the same values, bit for bit.
pub(crate) fn same(a: &[PickleValue], b: &[PickleValue]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| words(x) == words(y))
}

/// The shared runs of items and the table that finds them by content.
#[derive(Debug, Default)]
pub(crate) struct Interner {
    /// Keyed by [`hash`], already a hash: Fx costs one multiply on it, SipHash a round trip.
    by_hash: rustc_hash::FxHashMap<u64, SharedId>,
}

/// Where a content stands in an [`Interner`].
enum Found {
    /// Shared already, as this run.
    Shared(SharedId),
    /// Not yet: its hash is free, and it would be this run.
    New(u64, SharedId),
    /// Another content has its hash (or the runs are full): not shared.
    Clash,
}

impl Interner {
    fn find(&self, shared: &[Box<[PickleValue]>], items: &[PickleValue]) -> Found {
        let h = hash(items);
        match self.by_hash.get(&h) {
            Some(&id) if same(&shared[id as usize], items) => Found::Shared(id),
            Some(_) => Found::Clash,
            None => match SharedId::try_from(shared.len()) {
                Ok(id) => Found::New(h, id),
                Err(_) => Found::Clash,
            },
        }
    }

    /// The shared run equal to `items` in `shared`, adding `items` as a new one when there is
    /// none and its hash is free; `None` (nothing shared) when another content has its hash.
    pub(crate) fn intern(
        &mut self,
        shared: &mut Vec<Box<[PickleValue]>>,
        items: &[PickleValue],
    ) -> Option<SharedId> {
        match self.find(shared, items) {
            Found::Shared(id) => Some(id),
            Found::New(h, id) => {
                shared.push(items.into());
                self.by_hash.insert(h, id);
                Some(id)
            }
            Found::Clash => None,
        }
    }

    /// As [`Self::intern`], taking the items: `Err(items)` back when another content has
    /// their hash.
    pub(crate) fn intern_owned(
        &mut self,
        shared: &mut Vec<Box<[PickleValue]>>,
        items: Vec<PickleValue>,
    ) -> Result<SharedId, Vec<PickleValue>> {
        match self.find(shared, &items) {
            Found::Shared(id) => Ok(id),
            Found::New(h, id) => {
                shared.push(items.into_boxed_slice());
                self.by_hash.insert(h, id);
                Ok(id)
            }
            Found::Clash => Err(items),
        }
    }
}
