//! Hash maps and sets keyed by device addresses (or other integers no attacker chooses), with
//! a hasher made for them.
//!
//! The tracking allocator looks an address up on every free, the agent's mirror for nearly
//! every event and replay for nearly every trace entry; the standard library's SipHash is built to resist adversarial keys, which these do
//! not need, and costs more than the rest of an event. Addresses are multiples of 512, so the
//! hasher multiplies by a 64-bit odd constant (Fibonacci hashing, Knuth TAOCP vol. 3, 6.4) and
//! folds the high bits down, which spreads the low zero bits across the whole word.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// 2^64 / golden ratio, odd: the multiplier of Fibonacci hashing (Knuth TAOCP vol. 3, 6.4).
pub const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;

/// A hasher for `u64` keys (other keys hash byte by byte through the same mix).
#[derive(Debug, Clone, Copy, Default)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        let x = (self.0 ^ n).wrapping_mul(FIBONACCI);
        self.0 = x ^ (x >> 32);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// The [`BuildHasher`](std::hash::BuildHasher) of [`AddrHasher`], for maps with other key types
/// (host pointers as `usize`).
pub type BuildAddrHasher = BuildHasherDefault<AddrHasher>;

/// A map from addresses.
pub type AddrMap<V> = HashMap<u64, V, BuildAddrHasher>;

/// A set of addresses.
pub type AddrSet = HashSet<u64, BuildAddrHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_that_differ_only_in_high_bits_hash_apart() {
        let hash = |n: u64| {
            let mut h = AddrHasher::default();
            h.write_u64(n);
            h.finish()
        };
        let base = 0x7f00_0000_0000;
        let hashes: AddrSet = (0..1000).map(|i| hash(base + i * 512) & 0xfff).collect();
        // Low 12 bits (a table of 4096 buckets) still spread.
        assert!(hashes.len() > 700, "{}", hashes.len());
        let mut m: AddrMap<u32> = AddrMap::default();
        m.insert(base, 1);
        assert_eq!(m.get(&base), Some(&1));
    }

    #[test]
    fn a_usize_key_hashes_as_the_same_u64() {
        let hash = |f: &dyn Fn(&mut AddrHasher)| {
            let mut h = AddrHasher::default();
            f(&mut h);
            h.finish()
        };
        let addr = 0x7f12_3456_7a00_usize;
        assert_eq!(
            hash(&|h| h.write_usize(addr)),
            hash(&|h| h.write_u64(addr as u64))
        );
    }
}
