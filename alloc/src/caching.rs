//! PyTorch's CUDA caching allocator, rule for rule (PyTorch 2.x's
//! `c10/cuda/CUDACachingAllocator.cpp`; the [`allocator`] module says how, and where it differs).
//!
//! [`CachingAllocator`] is the allocator; [`AllocatorConfig`] its settings (PyTorch's
//! `PYTORCH_CUDA_ALLOC_CONF` syntax); [`format_memory_summary`] renders `DeviceStats` as
//! `torch.cuda.memory_summary()` does.

mod addr_table;
pub mod allocator;
pub mod backend;
mod block;
pub mod config;
mod context_table;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device_allocator;
pub mod error;
mod expandable;
mod free_set;
pub mod history;
pub mod pool;
pub mod sim;
mod state_lock;
pub mod stats;
pub mod summary;

pub use allocator::{CacheInfo, CachingAllocator, ContextProvider, MAX_REQUEST};
pub use config::{AllocatorConfig, AllocatorConfigBuilder, ConfigError};
pub use context_table::CONTEXT_TABLE_CAPACITY;
pub use error::{AllocError, OomInfo, OutOfMemory};
pub use history::{ContextLevel, HistoryOptions};
pub use pool::PoolId;
pub use summary::{HistoryColumns, format_memory_summary, format_memory_summary_with};
