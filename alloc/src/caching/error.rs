//! Errors of the caching allocator, and the facts of an out-of-memory failure.

use std::fmt;

use crate::caching::backend::{DeviceError, DevicePtr, StreamId};
use crate::caching::pool::PoolId;

/// Why an allocator call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocError {
    /// No memory could be found or obtained for the request (after every retry).
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemory>),
    /// The device reported an error other than running out of memory.
    #[error("device error: {0}")]
    Device(#[from] DeviceError),
    /// The pointer was not allocated by this allocator, or was already freed.
    #[error("invalid device pointer {0:#x}: not allocated by this allocator or already freed")]
    InvalidPointer(DevicePtr),
    /// An argument out of range (a memory fraction outside [0, 1], an oversized request...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl AllocError {
    /// The out-of-memory facts, when this is an OOM.
    pub fn out_of_memory(&self) -> Option<&OutOfMemory> {
        match self {
            AllocError::OutOfMemory(o) => Some(o),
            _ => None,
        }
    }
}

/// The facts of an allocation that failed for lack of memory, as PyTorch's OOM message states
/// them, plus the figures allocview adds (largest free block, memory stranded in split
/// segments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    /// Device index.
    pub device: i32,
    /// Stream the request was made on.
    pub stream: StreamId,
    /// Bytes the program asked for.
    pub requested: u64,
    /// The request after rounding (the block size it needed).
    pub rounded: u64,
    /// The segment size the allocator tried to obtain from the device.
    pub segment_size: u64,
    /// Total device memory.
    pub device_total: u64,
    /// Free device memory, as the device reported it after the allocator released its cache.
    pub device_free: u64,
    /// The limit a memory fraction sets, if one is set.
    pub allowed_max: Option<u64>,
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// Bytes reserved from the device.
    pub reserved: u64,
    /// `reserved - allocated`: cached, or held by blocks freed but still in use by a stream.
    pub reserved_unallocated: u64,
    /// The largest free cached block (0 when none).
    pub largest_free_block: u64,
    /// Free bytes inside segments that also hold allocated blocks: they cannot be released and
    /// only serve requests that fit in one of the pieces.
    pub stranded_in_split_segments: u64,
    /// Whether the allocator already uses expandable segments.
    pub expandable_segments: bool,
    /// The private pool the request went to (a graph capture's,
    /// [`begin_allocate_to_pool`](crate::caching::CachingAllocator::begin_allocate_to_pool)):
    /// only that pool's cached blocks could serve it.
    pub private_pool: Option<PoolId>,
    /// Whether a graph capture was under way: the allocator then does not free its cache and
    /// retry (PyTorch's rule), so memory cached for other pools stayed out of reach.
    pub during_capture: bool,
}

impl OutOfMemory {
    /// Whether `reserved - allocated` is large enough to be worth a fragmentation hint: at least
    /// the rounded request, or a quarter of everything reserved; and the request could fit at
    /// all (see [`fits_beside_allocated`](Self::fits_beside_allocated)).
    pub fn reserved_unallocated_is_large(&self) -> bool {
        self.reserved_unallocated > 0
            && !self.during_capture
            && self.fits_beside_allocated()
            && (self.reserved_unallocated >= self.rounded
                || self.reserved_unallocated >= self.reserved / LARGE_UNALLOCATED_FRACTION)
    }

    /// Whether the memory cached but unallocated would have covered the request had it been one
    /// contiguous range, within the memory fraction's limit: then expandable segments (which
    /// map pages into one growing range and unmap free pages) would likely have avoided this
    /// OOM.
    pub fn expandable_segments_would_help(&self) -> bool {
        !self.expandable_segments
            && !self.during_capture
            && self.reserved_unallocated >= self.rounded
            && self.fits_beside_allocated()
    }

    /// What this allocator may hold at most: the memory fraction's limit when one is set, else
    /// the device's total memory.
    pub fn limit(&self) -> u64 {
        self.allowed_max.unwrap_or(self.device_total)
    }

    /// Whether the request fits beside the allocated blocks within [`limit`](Self::limit). When
    /// it does not, no arrangement of the cache avoids the OOM: blocks must be freed, or the
    /// limit raised.
    pub fn fits_beside_allocated(&self) -> bool {
        self.allocated.saturating_add(self.rounded) <= self.limit()
    }
}

/// `reserved - allocated` counts as large from this fraction (1/4) of `reserved`.
const LARGE_UNALLOCATED_FRACTION: u64 = 4;

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of device memory: could not allocate {} ({} {} requested)",
            format_size(self.rounded),
            self.requested,
            if self.requested == 1 { "byte" } else { "bytes" },
        )?;
        // PyTorch's "Tried to allocate" figure: the segment a request needs from the device.
        if self.segment_size != self.rounded {
            write!(
                f,
                ", which needed a new segment of {}",
                format_size(self.segment_size)
            )?;
        }
        write!(
            f,
            " on device {} stream {}{}. The device holds {} in total and reports {} free",
            self.device,
            self.stream.0,
            match self.private_pool {
                Some(pool) => format!(" in private pool {pool}"),
                None => String::new(),
            },
            format_size(self.device_total),
            format_size(self.device_free),
        )?;
        if let Some(a) = self.allowed_max {
            write!(
                f,
                "; the memory fraction allows this process {}",
                format_size(a)
            )?;
        }
        write!(
            f,
            ". This allocator has {} in allocated blocks and {} reserved, so {} is reserved but \
             not allocated. The largest free cached block is {}, and {} is stranded in split \
             segments (free, but inside segments that still hold live blocks).",
            format_size(self.allocated),
            format_size(self.reserved),
            format_size(self.reserved_unallocated),
            format_size(self.largest_free_block),
            format_size(self.stranded_in_split_segments),
        )?;
        if !self.fits_beside_allocated() {
            write!(
                f,
                " The request does not fit beside the allocated blocks in the {} {} \
                 ({} left): no allocator setting avoids this OOM; free memory{}.",
                format_size(self.limit()),
                if self.allowed_max.is_some() {
                    "the memory fraction allows"
                } else {
                    "of the device"
                },
                format_size(self.limit().saturating_sub(self.allocated)),
                if self.allowed_max.is_some() {
                    " or raise the memory fraction"
                } else {
                    " or use a larger device"
                },
            )?;
        } else if self.during_capture {
            write!(
                f,
                " A graph capture is under way (begin_allocate_to_pool), so the allocator did not \
                 free its cache and retry: memory cached for other pools stayed out of reach. \
                 Call empty_cache() before the capture to give it back to the device."
            )?;
        } else if self.reserved_unallocated_is_large() && !self.expandable_segments {
            write!(
                f,
                " Much reserved memory is unallocated, a sign of fragmentation: try \
                 ALLOCVIEW_ALLOC_CONF=expandable_segments:True (or PYTORCH_CUDA_ALLOC_CONF)."
            )?;
            if self.expandable_segments_would_help() {
                write!(
                    f,
                    " The unallocated reserve would cover this request if it were contiguous, \
                     so replaying with expandable segments would likely have avoided this OOM."
                )?;
            }
        }
        Ok(())
    }
}

/// What OOM observers receive (PyTorch's `OutOfMemoryObserver` arguments and a little more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomInfo {
    /// Device index.
    pub device: i32,
    /// The rounded request size.
    pub size: u64,
    /// The segment size the allocator tried to obtain (what PyTorch passes as `alloc_size`).
    pub segment_size: u64,
    /// The request as the program made it.
    pub requested: u64,
    /// The memory fraction's limit when one is set, else the device total.
    pub total_or_allowed: u64,
    /// Free device memory.
    pub device_free: u64,
    /// The stream of the request.
    pub stream: StreamId,
}

/// PyTorch's `format_size`: bytes up to 1 KiB, then KiB / MiB / GiB with two decimals.
pub fn format_size(size: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if size <= KIB {
        format!("{size} bytes")
    } else if size <= MIB {
        format!("{:.2} KiB", size as f64 / KIB as f64)
    } else if size <= GIB {
        format!("{:.2} MiB", size as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", size as f64 / GIB as f64)
    }
}
