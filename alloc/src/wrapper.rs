//! [`AllocatorWrapper`]: TensorFlow's `AllocatorWrapper` decorator. A type that wraps another
//! allocator implements this trait with one required method, [`wrapped`](AllocatorWrapper::wrapped),
//! and overrides only the methods it changes; every other method forwards to the wrapped
//! allocator, and the type is an [`Allocator`] through a blanket impl.
//!
//! (With both `Allocator` and `AllocatorWrapper` in scope, call a wrapper's methods through
//! `Allocator::` or a `dyn Allocator`, since both traits name them.)
//!
//! # Examples
//!
//! A wrapper that renames an allocator and refuses large requests:
//!
//! ```
//! use std::ptr::NonNull;
//! use allocview_alloc::allocator::{AllocError, Allocator};
//! use allocview_alloc::attributes::AllocationAttributes;
//! use allocview_alloc::cpu::CpuAllocator;
//! use allocview_alloc::wrapper::AllocatorWrapper;
//!
//! struct SmallOnly(CpuAllocator);
//!
//! impl AllocatorWrapper for SmallOnly {
//!     fn wrapped(&self) -> &dyn Allocator {
//!         &self.0
//!     }
//!     fn name(&self) -> &str {
//!         "small-only"
//!     }
//!     fn allocate_raw(&self, alignment: usize, num_bytes: usize, attrs: &AllocationAttributes)
//!         -> Result<NonNull<u8>, AllocError> {
//!         if num_bytes > 4096 {
//!             return Err(AllocError::LimitExceeded { requested: num_bytes, in_use: 0, limit: 4096 });
//!         }
//!         self.0.allocate_raw(alignment, num_bytes, attrs)
//!     }
//! }
//!
//! let a: &dyn Allocator = &SmallOnly(CpuAllocator::new());
//! assert_eq!(a.name(), "small-only");
//! assert!(a.allocate_raw(64, 8192, &AllocationAttributes::default()).is_err());
//! ```

use std::ptr::NonNull;

use crate::allocator::{AllocError, Allocator};
use crate::attributes::AllocationAttributes;
use crate::stats::AllocatorStats;

/// A decorator over another allocator: every method defaults to forwarding to
/// [`wrapped`](AllocatorWrapper::wrapped). Implementors are [`Allocator`]s.
pub trait AllocatorWrapper: Send + Sync {
    /// The allocator calls are forwarded to.
    fn wrapped(&self) -> &dyn Allocator;

    /// See [`Allocator::name`]; forwards by default.
    fn name(&self) -> &str {
        self.wrapped().name()
    }

    /// See [`Allocator::allocate_raw`]; forwards by default.
    ///
    /// # Errors
    ///
    /// As the wrapped allocator's.
    fn allocate_raw(
        &self,
        alignment: usize,
        num_bytes: usize,
        attrs: &AllocationAttributes,
    ) -> Result<NonNull<u8>, AllocError> {
        self.wrapped().allocate_raw(alignment, num_bytes, attrs)
    }

    /// See [`Allocator::deallocate_raw`]; forwards by default.
    ///
    /// # Safety
    ///
    /// 1. `ptr` was returned by this wrapper's `allocate_raw`, and
    /// 2. it has not been deallocated since, and
    /// 3. nothing uses the memory after this call.
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>) {
        // SAFETY: forwarded under the caller's contract; the default `allocate_raw` hands out
        // the wrapped allocator's pointers unchanged.
        unsafe { self.wrapped().deallocate_raw(ptr) }
    }

    /// See [`Allocator::tracks_allocation_sizes`]; forwards by default.
    fn tracks_allocation_sizes(&self) -> bool {
        self.wrapped().tracks_allocation_sizes()
    }

    /// See [`Allocator::requested_size`]; forwards by default.
    fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.wrapped().requested_size(ptr)
    }

    /// See [`Allocator::allocated_size`]; forwards by default.
    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        self.wrapped().allocated_size(ptr)
    }

    /// See [`Allocator::allocation_id`]; forwards by default.
    fn allocation_id(&self, ptr: NonNull<u8>) -> Option<u64> {
        self.wrapped().allocation_id(ptr)
    }

    /// See [`Allocator::stats`]; forwards by default.
    fn stats(&self) -> Option<AllocatorStats> {
        self.wrapped().stats()
    }

    /// See [`Allocator::clear_stats`]; forwards by default.
    fn clear_stats(&self) -> bool {
        self.wrapped().clear_stats()
    }
}

impl<W: AllocatorWrapper> Allocator for W {
    fn name(&self) -> &str {
        AllocatorWrapper::name(self)
    }
    fn allocate_raw(
        &self,
        alignment: usize,
        num_bytes: usize,
        attrs: &AllocationAttributes,
    ) -> Result<NonNull<u8>, AllocError> {
        AllocatorWrapper::allocate_raw(self, alignment, num_bytes, attrs)
    }
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>) {
        // SAFETY: the caller upholds the same contract for the wrapper.
        unsafe { AllocatorWrapper::deallocate_raw(self, ptr) }
    }
    fn tracks_allocation_sizes(&self) -> bool {
        AllocatorWrapper::tracks_allocation_sizes(self)
    }
    fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        AllocatorWrapper::requested_size(self, ptr)
    }
    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        AllocatorWrapper::allocated_size(self, ptr)
    }
    fn allocation_id(&self, ptr: NonNull<u8>) -> Option<u64> {
        AllocatorWrapper::allocation_id(self, ptr)
    }
    fn stats(&self) -> Option<AllocatorStats> {
        AllocatorWrapper::stats(self)
    }
    fn clear_stats(&self) -> bool {
        AllocatorWrapper::clear_stats(self)
    }
}
