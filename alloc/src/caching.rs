//! PyTorch's CUDA caching allocator, rule for rule (PyTorch 2.x's
//! `c10/cuda/CUDACachingAllocator.cpp`; the [`allocator`] module says how, and where it differs).
//!
//! [`CachingAllocator`] is the allocator; [`AllocatorConfig`] its settings (PyTorch's
//! `PYTORCH_CUDA_ALLOC_CONF` syntax); [`format_memory_summary`] renders `DeviceStats` as
//! `torch.cuda.memory_summary()` does; [`DeviceBlock`] is a block that frees itself when
//! dropped ([`CachingAllocator::malloc_owned`]). The names a program needs to allocate are re-exported
//! here: the backend's [`StreamId`], [`DevicePtr`], [`DeviceBackend`] and [`DeviceError`], the
//! simulated device [`SimBackend`] (and `CudaBackend` with feature `cuda`), and [`DeviceStats`].
//!
//! # Examples
//! ```
//! use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
//!
//! let config = AllocatorConfig::parse("max_split_size_mb:128,expandable_segments:True")?;
//! let a = CachingAllocator::new(SimBackend::new(1 << 30), config);
//! let p = a.malloc(3 << 20, StreamId::DEFAULT)?;
//! assert_eq!(a.device_stats().allocated_bytes.0[0].current, 3 << 20);
//! a.free(p)?;
//! a.empty_cache()?;
//! assert_eq!(a.memory_stats()["reserved_bytes.all.current"], 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod addr_table;
pub mod allocator;
pub mod backend;
mod block;
pub mod config;
mod context_table;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device_allocator;
pub mod device_block;
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
pub use backend::{DeviceBackend, DeviceError, DevicePtr, StreamId};
pub use config::{AllocatorConfig, AllocatorConfigBuilder, ConfigError};
pub use context_table::CONTEXT_TABLE_CAPACITY;
#[cfg(feature = "cuda")]
pub use cuda::CudaBackend;
pub use device_block::DeviceBlock;
pub use error::{AllocError, OomInfo, OutOfMemory};
pub use history::{ContextLevel, HistoryOptions};
pub use pool::PoolId;
pub use sim::SimBackend;
pub use stats::DeviceStats;
pub use summary::{HistoryColumns, format_memory_summary, format_memory_summary_with};
