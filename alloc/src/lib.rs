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
