//! PyTorch's CUDA caching allocator, rule for rule (`docs/caching-allocator-spec.md`).

pub mod backend;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod sim;
pub mod stats;
pub mod summary;

pub use config::{AllocatorConfig, AllocatorConfigBuilder, ConfigError};
pub use summary::format_memory_summary;
