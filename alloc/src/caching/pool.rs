//! Block pools: the ordered sets of free blocks a request searches (PyTorch's `BlockPool`), and
//! the private pools of graph captures (`PrivatePool`, named by a [`PoolId`]).
//!
//! A pool orders its free blocks by `(stream, size, address)` in a `FreeSet` (a sorted vector, a B-tree when large), so best fit is
//! one ordered lookup from `(stream, size, 0)`: the first key with the same stream is the smallest
//! block that fits, the lowest address among equals. Unmapped ranges of expandable segments are
//! kept apart, ordered by `(stream, address)`.

use std::collections::BTreeMap;
use std::fmt;

use crate::caching::block::BlockId;
use crate::caching::free_set::FreeSet;

/// A memory pool id, PyTorch's `MempoolId_t`: `(0, 0)` is the default pools; graph captures use
/// private pools with other ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PoolId(pub u64, pub u64);

impl PoolId {
    /// The default pools.
    pub const DEFAULT: PoolId = PoolId(0, 0);

    /// Whether this names the default pools.
    pub fn is_default(self) -> bool {
        self == PoolId::DEFAULT
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {})", self.0, self.1)
    }
}

/// Free-set key: `(stream index, size, address)` packed into 128 bits (16 | 48 | 64), so one
/// integer comparison orders it. Streams get dense indices in order of first use; sizes from
/// 2^48 (256 TiB) up share the top key value and order by address among themselves.
pub(crate) type SizeKey = u128;
/// Largest size a key holds exactly.
const KEY_SIZE_MAX: u64 = (1 << 48) - 1;
/// Unmapped-set key: `(stream, address)`.
pub(crate) type AddrKey = (u64, u64);

/// The free blocks of one size class (small or large) of one pool.
#[derive(Debug)]
pub(crate) struct BlockPool {
    /// Small (rounded requests up to 1 MiB) or large.
    pub is_small: bool,
    /// The private pool this belongs to (`None` for the default pools).
    pub owner: Option<PoolId>,
    /// Free, mapped blocks by `(stream, size, address)`.
    pub blocks: FreeSet,
    /// Unmapped ranges of expandable segments by `(stream, address)`.
    pub unmapped: BTreeMap<AddrKey, BlockId>,
    /// Free-block searches so far (the clock of garbage collection ages).
    pub get_free_blocks_call_count: i64,
}

impl BlockPool {
    pub(crate) fn new(is_small: bool, owner: Option<PoolId>) -> BlockPool {
        BlockPool {
            is_small,
            owner,
            blocks: FreeSet::new(),
            unmapped: BTreeMap::new(),
            get_free_blocks_call_count: 0,
        }
    }
}

/// The key of a block in a pool's free set.
#[inline]
pub(crate) fn size_key(stream_index: u16, size: u64, addr: u64) -> SizeKey {
    (u128::from(stream_index) << 112)
        | (u128::from(size.min(KEY_SIZE_MAX)) << 64)
        | u128::from(addr)
}

/// The first key after every key of this stream.
#[inline]
pub(crate) fn stream_end_key(stream_index: u16) -> SizeKey {
    (u128::from(stream_index) + 1) << 112
}

/// A private pool (graph capture memory).
#[derive(Debug)]
pub(crate) struct PrivatePool {
    /// Its id.
    pub id: PoolId,
    /// Captures using it; at 0 its memory may be returned by the next `empty_cache`.
    pub use_count: i64,
    /// Live segments (device allocations and expandable ranges) holding its memory.
    pub segment_count: i64,
    /// Index of its large `BlockPool`.
    pub large: u32,
    /// Index of its small `BlockPool`.
    pub small: u32,
}
