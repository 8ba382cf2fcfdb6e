//! Instrumented allocators for allocview.
//!
//! - TensorFlow's allocator vocabulary: [`allocator::Allocator`], [`attributes`],
//!   [`stats::AllocatorStats`], [`registry::AllocatorRegistry`], a delegating
//!   [`wrapper`], [`cpu::CpuAllocator`] and [`tracking::TrackingAllocator`].
//! - A device allocator with an owning buffer ([`device`]).
//! - An instrumented `GlobalAlloc` ([`global::Instrumented`]).
//! - PyTorch's CUDA caching allocator ([`caching::CachingAllocator`]) over a device backend:
//!   the simulated device ([`caching::sim::SimBackend`]) or real CUDA (feature `cuda`).
//! - The events allocators publish ([`event`]) and the snapshot model ([`snapshot`]).
//!
//! The TensorFlow-style names are re-exported here at the crate root ([`Allocator`],
//! [`AllocatorExt`], [`AllocatorAttributes`], [`AllocationAttributes`], [`AllocatorStats`],
//! [`AllocatorRegistry`], [`AllocatorWrapper`], [`CpuAllocator`], [`TrackingAllocator`],
//! [`DeviceAllocator`], [`CpuDeviceAllocator`], [`Buffer`], [`Instrumented`]); the caching
//! allocator's are in [`caching`]. Both modules have an error type named `AllocError`
//! ([`allocator::AllocError`] for host allocators, [`caching::AllocError`] for the device), so
//! neither is re-exported here.
//!
//! # Examples
//! ```
//! use std::sync::Arc;
//! use allocview_alloc::{
//!     AllocationAttributes, Allocator, AllocatorRegistry, CpuAllocator, TrackingAllocator,
//! };
//!
//! let cpu = Arc::new(CpuAllocator::new());
//! let tracking = Arc::new(TrackingAllocator::new(cpu.clone()));
//! let registry = AllocatorRegistry::new();
//! registry.register("cpu", 10, cpu.clone())?;
//! registry.register("tracking", 20, tracking.clone())?;
//! // The highest priority answers.
//! let (name, _, chosen) = registry.get_entry().unwrap();
//! assert_eq!(name, "tracking");
//! let p = chosen.allocate_raw(64, 100, &AllocationAttributes::default())?;
//! assert_eq!(tracking.requested_size(p), Some(100));
//! // SAFETY: `p` came from `chosen` and is freed once.
//! unsafe { chosen.deallocate_raw(p) };
//! assert_eq!(tracking.high_watermark(), 100);
//! assert_eq!(cpu.stats().unwrap().bytes_in_use, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Unsafe code lives in this crate only (raw memory, the global allocator, CUDA FFI); every
//! `unsafe` block says why it holds, and CI runs these tests under valgrind memcheck.

// This crate is where allocview's unsafe code lives; the workspace denies it elsewhere.
#![allow(unsafe_code)]

pub mod addr_map;
pub mod allocator;
pub mod attributes;
pub mod caching;
pub mod cpu;
pub mod device;
pub mod event;
pub mod global;
pub mod registry;
pub mod snapshot;
pub mod stats;
pub mod tracking;
pub mod wrapper;

pub use allocator::{Allocator, AllocatorExt};
pub use attributes::{AllocationAttributes, AllocatorAttributes};
pub use cpu::CpuAllocator;
pub use device::{Buffer, CpuDeviceAllocator, DeviceAllocator};
pub use global::Instrumented;
pub use registry::AllocatorRegistry;
pub use stats::AllocatorStats;
pub use tracking::TrackingAllocator;
pub use wrapper::AllocatorWrapper;
