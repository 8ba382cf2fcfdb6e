//! A small deterministic random generator for the stress tests: Marsaglia's xorshift64
//! ("Xorshift RNGs", Journal of Statistical Software 8(14), 2003; shifts 13, 7, 17).
//!
//! Std only and dependency free: the alloc and agent crates' own stress tests include this file
//! with `#[path]` (they cannot depend on this package), the others use it as
//! `allocview_tests::xorshift`.

/// The generator's state; seed it with any non-zero value (zero stays zero).
pub struct Rng(pub u64);

impl Rng {
    /// The next value of the sequence (the new state).
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
