//! The [`Allocator`] trait: TensorFlow's allocator interface (`tensorflow/core/framework/
//! allocator.h`) in Rust, plus typed helpers ([`AllocatorExt`]).
//!
//! An allocator hands out raw, aligned memory (`allocate_raw`) and takes it back
//! (`deallocate_raw`). Allocators that know the size of each live allocation say so
//! (`tracks_allocation_sizes`) and answer `requested_size`, `allocated_size` and
//! `allocation_id`; the others answer `None`. The trait is object safe: registries and wrappers
//! hold `Arc<dyn Allocator>`.
//!
//! # Zero-byte requests
//!
//! A request for zero bytes succeeds, as `malloc(0)` does in TensorFlow's CPU allocator: it
//! returns a unique, well-aligned, non-null pointer that must not be read or written, and that
//! must be given back to `deallocate_raw` like any other. It counts as an allocation of zero
//! bytes in the stats.

use std::mem::{align_of, size_of};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::attributes::AllocationAttributes;
use crate::stats::AllocatorStats;

/// Alignment every allocation gets at least (TensorFlow's `kAllocatorAlignment` with AVX-512:
/// one cache line, and the widest vector register).
pub const DEFAULT_ALIGNMENT: usize = 64;

/// Why an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The alignment asked for is not a power of two.
    #[error("alignment {0} is not a power of two")]
    InvalidAlignment(usize),
    /// The size (plus the allocator's bookkeeping, or times the element size) does not fit in
    /// the address space.
    #[error("allocation of {count} x {elem_size} bytes overflows the address space")]
    SizeOverflow {
        /// Number of elements (1 for raw requests).
        count: usize,
        /// Bytes per element (the raw size for raw requests).
        elem_size: usize,
    },
    /// The allocator's byte limit would be exceeded.
    #[error(
        "allocating {requested} bytes would exceed the limit of {limit} bytes ({in_use} in use)"
    )]
    LimitExceeded {
        /// Bytes asked for.
        requested: usize,
        /// Bytes in use at the time.
        in_use: usize,
        /// The allocator's limit.
        limit: usize,
    },
    /// The underlying memory source had nothing to give.
    #[error("out of memory allocating {size} bytes aligned to {alignment}")]
    OutOfMemory {
        /// Bytes asked for.
        size: usize,
        /// Alignment asked for.
        alignment: usize,
    },
}

/// A memory allocator (TensorFlow's `Allocator`).
///
/// Implementations are shared between threads (`Send + Sync`) and use interior mutability for
/// their bookkeeping.
pub trait Allocator: Send + Sync {
    /// A short name for logs and registries (`"cpu"`; a wrapper such as
    /// [`TrackingAllocator`](crate::tracking::TrackingAllocator) answers its inner allocator's
    /// name, as TensorFlow's does).
    fn name(&self) -> &str;

    /// Allocates `num_bytes` bytes aligned to `alignment` (a power of two).
    ///
    /// A zero-byte request returns a unique pointer that must still be deallocated (see the
    /// [module docs](self)).
    ///
    /// # Errors
    ///
    /// [`AllocError::InvalidAlignment`] if `alignment` is not a power of two,
    /// [`AllocError::SizeOverflow`] if the request cannot be laid out,
    /// [`AllocError::LimitExceeded`] if the allocator's limit would be passed, and
    /// [`AllocError::OutOfMemory`] if the memory source fails.
    fn allocate_raw(
        &self,
        alignment: usize,
        num_bytes: usize,
        attrs: &AllocationAttributes,
    ) -> Result<NonNull<u8>, AllocError>;

    /// Gives back memory from [`allocate_raw`](Allocator::allocate_raw).
    ///
    /// # Safety
    ///
    /// 1. `ptr` was returned by `allocate_raw` on this same allocator (or on the allocator a
    ///    wrapper forwards to, through the wrapper), and
    /// 2. it has not been deallocated since, and
    /// 3. nothing reads or writes the memory after this call.
    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>);

    /// Whether this allocator answers [`requested_size`](Allocator::requested_size),
    /// [`allocated_size`](Allocator::allocated_size) and
    /// [`allocation_id`](Allocator::allocation_id) for its live allocations.
    fn tracks_allocation_sizes(&self) -> bool {
        false
    }

    /// The size the caller asked for when `ptr` was allocated; `None` if sizes are not tracked
    /// or `ptr` is not a live allocation of this allocator.
    fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        let _ = ptr;
        None
    }

    /// The size actually reserved for `ptr` (at least the requested size); `None` where not
    /// tracked.
    fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
        let _ = ptr;
        None
    }

    /// A number identifying the allocation at `ptr` (from 1, in allocation order); `None`
    /// where not tracked.
    fn allocation_id(&self, ptr: NonNull<u8>) -> Option<u64> {
        let _ = ptr;
        None
    }

    /// The allocator's counters, where it keeps them.
    fn stats(&self) -> Option<AllocatorStats> {
        None
    }

    /// Resets the counters (all but bytes in use, which stays true, and the limit); returns
    /// whether this allocator keeps stats that were cleared.
    fn clear_stats(&self) -> bool {
        false
    }
}

macro_rules! forward_allocator {
    ($($ty:tt)*) => {
        impl<T: Allocator + ?Sized> Allocator for $($ty)*<T> {
            fn name(&self) -> &str {
                (**self).name()
            }
            fn allocate_raw(
                &self,
                alignment: usize,
                num_bytes: usize,
                attrs: &AllocationAttributes,
            ) -> Result<NonNull<u8>, AllocError> {
                (**self).allocate_raw(alignment, num_bytes, attrs)
            }
            unsafe fn deallocate_raw(&self, ptr: NonNull<u8>) {
                // SAFETY: the caller upholds `deallocate_raw`'s contract for the allocator this
                // handle points to.
                unsafe { (**self).deallocate_raw(ptr) }
            }
            fn tracks_allocation_sizes(&self) -> bool {
                (**self).tracks_allocation_sizes()
            }
            fn requested_size(&self, ptr: NonNull<u8>) -> Option<usize> {
                (**self).requested_size(ptr)
            }
            fn allocated_size(&self, ptr: NonNull<u8>) -> Option<usize> {
                (**self).allocated_size(ptr)
            }
            fn allocation_id(&self, ptr: NonNull<u8>) -> Option<u64> {
                (**self).allocation_id(ptr)
            }
            fn stats(&self) -> Option<AllocatorStats> {
                (**self).stats()
            }
            fn clear_stats(&self) -> bool {
                (**self).clear_stats()
            }
        }
    };
}

forward_allocator!(Arc);

/// Typed helpers over any [`Allocator`] (TensorFlow's `Allocate<T>` / `Deallocate<T>`),
/// usable on `dyn Allocator` too.
pub trait AllocatorExt: Allocator {
    /// Allocates room for `count` values of `T`, aligned to at least [`DEFAULT_ALIGNMENT`] and
    /// `T`'s own alignment. The memory is uninitialized.
    ///
    /// # Errors
    ///
    /// [`AllocError::SizeOverflow`] if `count * size_of::<T>()` overflows, else as
    /// [`Allocator::allocate_raw`].
    ///
    /// # Examples
    ///
    /// ```
    /// use allocview_alloc::allocator::AllocatorExt;
    /// use allocview_alloc::cpu::CpuAllocator;
    ///
    /// let cpu = CpuAllocator::new();
    /// let floats = cpu.allocate::<f32>(1024).unwrap();
    /// assert_eq!(floats.as_ptr() as usize % 64, 0);
    /// // SAFETY: allocated above on `cpu` with the same count, not freed yet.
    /// unsafe { cpu.deallocate(floats, 1024) };
    /// assert!(cpu.allocate::<u64>(usize::MAX).is_err());
    /// ```
    fn allocate<T>(&self, count: usize) -> Result<NonNull<T>, AllocError> {
        self.allocate_with::<T>(count, &AllocationAttributes::default())
    }

    /// [`allocate`](AllocatorExt::allocate) with allocation attributes.
    ///
    /// # Errors
    ///
    /// As [`allocate`](AllocatorExt::allocate).
    fn allocate_with<T>(
        &self,
        count: usize,
        attrs: &AllocationAttributes,
    ) -> Result<NonNull<T>, AllocError> {
        let bytes = count
            .checked_mul(size_of::<T>())
            .ok_or(AllocError::SizeOverflow {
                count,
                elem_size: size_of::<T>(),
            })?;
        let alignment = align_of::<T>().max(DEFAULT_ALIGNMENT);
        self.allocate_raw(alignment, bytes, attrs)
            .map(NonNull::cast)
    }

    /// Gives back memory from [`allocate`](AllocatorExt::allocate). No destructors run.
    ///
    /// # Safety
    ///
    /// 1. `ptr` came from `allocate::<T>` (or `allocate_with::<T>`) on this allocator, and
    /// 2. it has not been deallocated since, and
    /// 3. nothing uses the memory after this call.
    unsafe fn deallocate<T>(&self, ptr: NonNull<T>, count: usize) {
        let _ = count;
        // SAFETY: the caller's contract is `deallocate_raw`'s for the same pointer.
        unsafe { self.deallocate_raw(ptr.cast()) }
    }
}

impl<A: Allocator + ?Sized> AllocatorExt for A {}
