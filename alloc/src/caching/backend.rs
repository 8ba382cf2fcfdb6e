//! The device under a caching allocator: segments, streams, events and virtual memory.
//!
//! [`DeviceBackend`] is everything [`CachingAllocator`](crate::caching::CachingAllocator) asks of
//! a device. Two implementations: the simulated device ([`SimBackend`](crate::caching::sim::SimBackend)),
//! on which every rule is tested, and real CUDA (`CudaBackend`, feature `cuda`), which wraps the
//! driver API in layers (raw calls, status to `Result`, safe handles).

use std::fmt;

/// A device address.
pub type DevicePtr = u64;

/// A stream handle. `StreamId(0)` is the device's default stream, as in PyTorch's traces (which
/// write the `cudaStream_t` value as an integer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

/// A device event handle (timing disabled), used to know when another stream is done with a
/// block that was freed while that stream still used it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// A device call that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The device has no memory left for this request (cudaErrorMemoryAllocation).
    #[error("device out of memory allocating {size} bytes")]
    OutOfMemory {
        /// Bytes asked for.
        size: u64,
    },
    /// No CUDA driver could be loaded on this machine.
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// The driver loaded but there is no usable device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// An argument the device rejects (unknown pointer, stream or event, bad size).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// Any other driver error, with the driver's own code and message.
    #[error("device error {code}: {message}")]
    Driver {
        /// The driver's status code.
        code: i32,
        /// The driver's description of it.
        message: String,
    },
}

impl DeviceError {
    /// Whether this is an out-of-memory error (the caching allocator frees its cache and
    /// retries on these, and reports any other error at once).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, DeviceError::OutOfMemory { .. })
    }
}

/// What a caching allocator needs from a device.
///
/// All methods take `&self`: backends are shared between the allocator and its owner (a test
/// that completes stream work, replay that places segments at recorded addresses), so they use
/// interior mutability where they need state.
pub trait DeviceBackend: Send + Sync + 'static {
    /// The device index (as in `cuda:N`).
    fn device(&self) -> i32;

    /// Allocates a segment of `size` bytes (cudaMalloc).
    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError>;

    /// Frees a segment that [`malloc`](Self::malloc) returned (cudaFree).
    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError>;

    /// `(free, total)` device memory in bytes (cudaMemGetInfo).
    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError>;

    /// Creates a new stream.
    fn create_stream(&self) -> Result<StreamId, DeviceError>;

    /// Creates an event (timing disabled).
    fn create_event(&self) -> Result<EventId, DeviceError>;

    /// Destroys an event.
    fn destroy_event(&self, event: EventId) -> Result<(), DeviceError>;

    /// Records `event` on `stream`: it completes when the work queued on the stream so far does.
    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), DeviceError>;

    /// Whether the work an event was recorded after has completed (cudaEventQuery).
    fn query_event(&self, event: EventId) -> Result<bool, DeviceError>;

    /// Waits until the event completes (cudaEventSynchronize).
    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError>;

    /// Waits for all work on the device (cudaDeviceSynchronize).
    fn synchronize_device(&self) -> Result<(), DeviceError>;

    /// The page size for virtual-memory mappings (cuMemGetAllocationGranularity); expandable
    /// segments map in multiples of it.
    fn vm_granularity(&self) -> u64;

    /// Reserves `size` bytes of device address space, mapping nothing (cuMemAddressReserve).
    fn vm_reserve(&self, size: u64) -> Result<DevicePtr, DeviceError>;

    /// Backs `[va, va + size)` of a reserved range with physical memory and makes it accessible
    /// (cuMemCreate + cuMemMap + cuMemSetAccess). `size` is a multiple of the granularity.
    fn vm_map(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError>;

    /// Unmaps `[va, va + size)` and releases its physical memory (cuMemUnmap + cuMemRelease).
    fn vm_unmap(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError>;

    /// Gives back a reserved range; everything in it must be unmapped (cuMemAddressFree).
    fn vm_release(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError>;
}

/// A shared backend is a backend: the allocator can own an `Arc` while a test, the demo or
/// replay keeps another handle to drive the simulated device.
impl<T: DeviceBackend + ?Sized> DeviceBackend for std::sync::Arc<T> {
    fn device(&self) -> i32 {
        (**self).device()
    }
    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        (**self).malloc(size)
    }
    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        (**self).free(ptr)
    }
    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        (**self).mem_get_info()
    }
    fn create_stream(&self) -> Result<StreamId, DeviceError> {
        (**self).create_stream()
    }
    fn create_event(&self) -> Result<EventId, DeviceError> {
        (**self).create_event()
    }
    fn destroy_event(&self, event: EventId) -> Result<(), DeviceError> {
        (**self).destroy_event(event)
    }
    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), DeviceError> {
        (**self).record_event(event, stream)
    }
    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        (**self).query_event(event)
    }
    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        (**self).synchronize_event(event)
    }
    fn synchronize_device(&self) -> Result<(), DeviceError> {
        (**self).synchronize_device()
    }
    fn vm_granularity(&self) -> u64 {
        (**self).vm_granularity()
    }
    fn vm_reserve(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        (**self).vm_reserve(size)
    }
    fn vm_map(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError> {
        (**self).vm_map(va, size)
    }
    fn vm_unmap(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError> {
        (**self).vm_unmap(va, size)
    }
    fn vm_release(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError> {
        (**self).vm_release(va, size)
    }
}
