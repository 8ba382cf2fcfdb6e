//! PyTorch's CUDA caching allocator, rule for rule (`docs/caching-allocator-spec.md`).

pub mod backend;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod sim;
pub mod stats;
