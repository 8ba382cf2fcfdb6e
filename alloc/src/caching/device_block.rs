//! [`DeviceBlock`]: a block of a [`CachingAllocator`] that frees itself when dropped, as a
//! PyTorch tensor's storage does (its `DataPtr` holds the caching allocator's deleter).
//!
//! [`CachingAllocator::malloc`] hands out a bare [`DevicePtr`] that the program must give back
//! with [`CachingAllocator::free`] exactly once; a `DeviceBlock` does that on drop, so an early
//! return or a panic cannot leak the block (the address [`DeviceBlock::ptr`] returns is a
//! plain number: device work that uses it must not outlive the block, or must be recorded with
//! [`DeviceBlock::record_stream`]). It holds an `Arc` of its allocator, so it can move between
//! threads and outlive the scope that allocated it.

use std::fmt;
use std::sync::Arc;

use crate::caching::allocator::CachingAllocator;
use crate::caching::backend::{DeviceBackend, DevicePtr, StreamId};
use crate::caching::error::AllocError;

/// A block of device memory from a [`CachingAllocator`], freed when dropped.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
///
/// let a = Arc::new(CachingAllocator::new(SimBackend::new(1 << 30), AllocatorConfig::default()));
/// let block = a.malloc_owned(1000, StreamId::DEFAULT)?;
/// assert_eq!(block.len(), 1000);
/// assert_eq!(a.memory_stats()["allocated_bytes.all.current"], 1024);
/// drop(block); // freed: back in the cache
/// assert_eq!(a.memory_stats()["allocated_bytes.all.current"], 0);
/// # Ok::<(), allocview_alloc::caching::AllocError>(())
/// ```
pub struct DeviceBlock<B: DeviceBackend> {
    allocator: Arc<CachingAllocator<B>>,
    ptr: DevicePtr,
    len: u64,
    stream: StreamId,
    /// Whether the drop frees the block (false once [`free`](Self::free) or
    /// [`into_raw`](Self::into_raw) took it).
    owned: bool,
}

impl<B: DeviceBackend> CachingAllocator<B> {
    /// [`malloc`](Self::malloc), as a [`DeviceBlock`] that frees the block when dropped.
    ///
    /// # Errors
    /// As [`malloc`](Self::malloc).
    pub fn malloc_owned(
        self: &Arc<Self>,
        size: u64,
        stream: StreamId,
    ) -> Result<DeviceBlock<B>, AllocError> {
        let ptr = self.malloc(size, stream)?;
        Ok(DeviceBlock {
            allocator: Arc::clone(self),
            ptr,
            len: size,
            stream,
            owned: true,
        })
    }
}

impl<B: DeviceBackend> DeviceBlock<B> {
    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The bytes asked for (the block itself may be larger: see
    /// [`CachingAllocator::base_allocation`] and the allocator's rounding).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether zero bytes were asked for (the block still holds the smallest block size).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stream the block was allocated on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The allocator the block belongs to.
    pub fn allocator(&self) -> &Arc<CachingAllocator<B>> {
        &self.allocator
    }

    /// Notes that `stream` uses the block ([`CachingAllocator::record_stream`]): its free, at
    /// drop, waits for the work queued on `stream` until then.
    ///
    /// # Errors
    /// As [`CachingAllocator::record_stream`].
    pub fn record_stream(&self, stream: StreamId) -> Result<(), AllocError> {
        self.allocator.record_stream(self.ptr, stream)
    }

    /// Frees the block now, returning the error [`CachingAllocator::free`] reports (a drop
    /// can only log it).
    ///
    /// # Errors
    /// As [`CachingAllocator::free`].
    pub fn free(mut self) -> Result<(), AllocError> {
        self.owned = false;
        self.allocator.free(self.ptr)
    }

    /// Gives up ownership: the block stays allocated, and the caller frees the returned
    /// pointer with [`CachingAllocator::free`] on [`allocator`](Self::allocator).
    pub fn into_raw(mut self) -> DevicePtr {
        self.owned = false;
        self.ptr
    }
}

impl<B: DeviceBackend> Drop for DeviceBlock<B> {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // The pointer is this block's own, allocated and not freed: the only error left is
        // the device's, recording an event for a stream that used the block.
        if let Err(e) = self.allocator.free(self.ptr) {
            tracing::warn!(ptr = self.ptr, error = %e, "freeing a dropped DeviceBlock failed");
        }
    }
}

impl<B: DeviceBackend> fmt::Debug for DeviceBlock<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBlock")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("stream", &self.stream)
            .field("owned", &self.owned)
            .finish()
    }
}
