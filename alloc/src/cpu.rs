//! [`CpuAllocator`]: host memory from the global heap, aligned to [`DEFAULT_ALIGNMENT`] (64
//! bytes) or more, with stats that can be switched on and off at run time and an optional byte
//! limit (TensorFlow's `CPUAllocator` in `cpu_allocator_impl.cc`, whose limit logs a warning; this
//! one fails the allocation).
//!
//! # Layout
//!
//! `std::alloc` needs the layout again at free time, and [`Allocator::deallocate_raw`] only gets
//! the pointer, so each allocation carries a header. Aligned allocation in the C library
//! (`posix_memalign`, which `std::alloc` uses for alignments above 16) costs 5 to 15 times a
//! plain `malloc` (measured in `benches/cpu_allocators.rs`), so the block is taken with the
//! heap's natural alignment and aligned by hand: with alignment `A` (at least 64), the block is
//! `num_bytes + A + HEADER_SIZE` bytes; the caller's pointer is the first `A`-aligned address at
//! least `HEADER_SIZE` bytes in, and the header (where the block starts, the requested size,
//! the alignment, whether it was counted) sits just below it. One pointer subtraction finds it
//! again: no map, no lock.

use std::alloc::{self, Layout};
use std::mem::size_of;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

use crate::allocator::{AllocError, Allocator, DEFAULT_ALIGNMENT};
use crate::attributes::AllocationAttributes;
use crate::stats::AllocatorStats;

/// What sits just below each pointer a [`CpuAllocator`] hands out.
#[repr(C)]
struct Header {
    /// Bytes from the start of the block to the caller's pointer.
    offset: usize,
    /// Bytes the caller asked for.
    num_bytes: usize,
    /// The alignment given (a power of two, at least 64) with [`COUNTED`] in bit 0.
    align_and_flags: usize,
}

/// Header flag: the allocation was added to `bytes_in_use`, so its free subtracts it again
/// (stats may have been switched off or on in between).
const COUNTED: usize = 1;

/// Bytes the header occupies below the caller's pointer.
const HEADER_SIZE: usize = size_of::<Header>();

/// Alignment of the blocks taken from the global heap: what `malloc` gives anyway, so
/// `std::alloc` takes its fast path.
const BLOCK_ALIGNMENT: usize = 16;

const _: () = assert!(HEADER_SIZE < DEFAULT_ALIGNMENT);

/// Host memory allocator: 64-byte aligned (or more on request), with run-time switchable stats
/// and an optional byte limit.
///
/// Stats count the bytes callers ask for. [`Allocator::tracks_allocation_sizes`] is false, as
/// TensorFlow's: the header holds the size, but a safe `requested_size(ptr)` cannot know that
/// an arbitrary pointer has one.
///
/// # Examples
///
/// ```
/// use allocview_alloc::allocator::Allocator;
/// use allocview_alloc::attributes::AllocationAttributes;
/// use allocview_alloc::cpu::CpuAllocator;
///
/// let cpu = CpuAllocator::with_limit(1024);
/// let attrs = AllocationAttributes::default();
/// let p = cpu.allocate_raw(64, 1000, &attrs).unwrap();
/// assert!(cpu.allocate_raw(64, 100, &attrs).is_err()); // over the limit
/// // SAFETY: `p` came from `cpu` and is freed once.
/// unsafe { cpu.deallocate_raw(p) };
/// assert_eq!(cpu.stats().unwrap().bytes_in_use, 0);
/// ```
#[derive(Debug)]
pub struct CpuAllocator {
    collect_stats: AtomicBool,
    limit: Option<usize>,
    in_use: AtomicUsize,
    num_allocs: AtomicU64,
    peak: AtomicUsize,
    largest: AtomicUsize,
}

impl Default for CpuAllocator {
    fn default() -> Self {
        CpuAllocator::new()
    }
}

impl CpuAllocator {
    /// An allocator collecting stats, without a limit.
    pub const fn new() -> CpuAllocator {
        CpuAllocator {
            collect_stats: AtomicBool::new(true),
            limit: None,
            in_use: AtomicUsize::new(0),
            num_allocs: AtomicU64::new(0),
            peak: AtomicUsize::new(0),
            largest: AtomicUsize::new(0),
        }
    }

    /// An allocator collecting stats that refuses to have more than `limit_bytes` in use.
    pub const fn with_limit(limit_bytes: usize) -> CpuAllocator {
        let mut a = CpuAllocator::new();
        a.limit = Some(limit_bytes);
        a
    }

    /// Switches stats collection on or off (TensorFlow's `EnableCPUAllocatorStats`). While off,
    /// allocations are neither counted nor (when freed) discounted, unless a limit needs
    /// `bytes_in_use`.
    pub fn set_collect_stats(&self, on: bool) {
        self.collect_stats.store(on, Relaxed);
    }

    /// Whether stats are being collected.
    pub fn collects_stats(&self) -> bool {
        self.collect_stats.load(Relaxed)
    }

    /// The byte limit, if any.
    pub fn limit(&self) -> Option<usize> {
        self.limit
    }

    /// Adds `n` to `in_use` unless that passes the limit; returns the new value.
    fn reserve(&self, n: usize) -> Result<usize, AllocError> {
        let Some(limit) = self.limit else {
            return Ok(self.in_use.fetch_add(n, Relaxed).wrapping_add(n));
        };
        let mut current = self.in_use.load(Relaxed);
        loop {
            let new = current.checked_add(n).filter(|&new| new <= limit).ok_or(
                AllocError::LimitExceeded {
                    requested: n,
                    in_use: current,
                    limit,
                },
            )?;
            match self
                .in_use
                .compare_exchange_weak(current, new, Relaxed, Relaxed)
            {
                Ok(_) => return Ok(new),
                Err(actual) => current = actual,
            }
        }
    }
}

/// Raises `max` to `value`; a plain load first, since `fetch_max` is a compare-and-swap loop
/// even when there is nothing to raise.
#[inline]
fn raise(max: &AtomicUsize, value: usize) {
    if value > max.load(Relaxed) {
        max.fetch_max(value, Relaxed);
    }
}

impl Allocator for CpuAllocator {
    fn name(&self) -> &str {
        "cpu"
    }

    fn allocate_raw(
        &self,
        alignment: usize,
        num_bytes: usize,
        _attrs: &AllocationAttributes,
    ) -> Result<NonNull<u8>, AllocError> {
        if !alignment.is_power_of_two() {
            return Err(AllocError::InvalidAlignment(alignment));
        }
        let align = alignment.max(DEFAULT_ALIGNMENT);
        let overflow = AllocError::SizeOverflow {
            count: 1,
            elem_size: num_bytes,
        };
        let total = num_bytes
            .checked_add(align + HEADER_SIZE)
            .ok_or(overflow.clone())?;
        let layout = Layout::from_size_align(total, BLOCK_ALIGNMENT).map_err(|_| overflow)?;

        let collect = self.collect_stats.load(Relaxed);
        let counted = collect || self.limit.is_some();
        let in_use = if counted {
            Some(self.reserve(num_bytes)?)
        } else {
            None
        };

        // SAFETY: `layout` has a non-zero size (at least `align` >= 64 bytes).
        let base = unsafe { alloc::alloc(layout) };
        let Some(base) = NonNull::new(base) else {
            if counted {
                self.in_use.fetch_sub(num_bytes, Relaxed);
            }
            return Err(AllocError::OutOfMemory {
                size: num_bytes,
                alignment: align,
            });
        };
        let base_addr = base.as_ptr() as usize;
        // The first `align`-aligned address with room for the header below it: at most
        // `HEADER_SIZE + align - 1` bytes in, so `num_bytes` still fit before the block's end.
        let offset = (base_addr + HEADER_SIZE).next_multiple_of(align) - base_addr;
        // SAFETY: `offset` <= HEADER_SIZE + align - 1 < total, so the pointer is in the block.
        let user = unsafe { base.add(offset) };
        // SAFETY: the header's `HEADER_SIZE` bytes lie below `user` and at or above `base`
        // (`offset` >= HEADER_SIZE), and `user - HEADER_SIZE` is aligned for `usize` (`user` is
        // 64-aligned, `HEADER_SIZE` a multiple of 8).
        unsafe {
            user.sub(HEADER_SIZE).cast::<Header>().write(Header {
                offset,
                num_bytes,
                align_and_flags: align | if counted { COUNTED } else { 0 },
            });
        }
        if collect {
            self.num_allocs.fetch_add(1, Relaxed);
            raise(&self.largest, num_bytes);
            if let Some(in_use) = in_use {
                raise(&self.peak, in_use);
            }
        }
        Ok(user)
    }

    unsafe fn deallocate_raw(&self, ptr: NonNull<u8>) {
        // SAFETY: by the caller's contract `ptr` came from `allocate_raw`, which wrote a header
        // just below it; it is aligned and still live.
        let header = unsafe { ptr.sub(HEADER_SIZE).cast::<Header>().read() };
        let align = header.align_and_flags & !COUNTED;
        if header.align_and_flags & COUNTED != 0 {
            self.in_use.fetch_sub(header.num_bytes, Relaxed);
        }
        // SAFETY: `allocate_raw` put `ptr` `offset` bytes into its block.
        let base = unsafe { ptr.sub(header.offset) };
        // SAFETY: `allocate_raw` built this same layout from these values, and it passed
        // `Layout::from_size_align` then.
        let layout = unsafe {
            Layout::from_size_align_unchecked(
                header.num_bytes + align + HEADER_SIZE,
                BLOCK_ALIGNMENT,
            )
        };
        // SAFETY: `base` was allocated with `layout` by the global allocator and is freed once
        // (the caller's contract).
        unsafe { alloc::dealloc(base.as_ptr(), layout) };
    }

    fn stats(&self) -> Option<AllocatorStats> {
        if !self.collects_stats() {
            return None;
        }
        Some(AllocatorStats {
            num_allocs: self.num_allocs.load(Relaxed),
            bytes_in_use: self.in_use.load(Relaxed) as u64,
            peak_bytes_in_use: self.peak.load(Relaxed) as u64,
            largest_alloc_size: self.largest.load(Relaxed) as u64,
            bytes_limit: self.limit.map(|l| l as u64),
        })
    }

    fn clear_stats(&self) -> bool {
        self.num_allocs.store(0, Relaxed);
        self.peak.store(self.in_use.load(Relaxed), Relaxed);
        self.largest.store(0, Relaxed);
        true
    }
}
