//! Device memory behind one interface ([`DeviceAllocator`]: allocate, release, copy in a
//! direction, zero) and an owning [`Buffer`] that frees itself on drop (RAII), after the device
//! allocator of a small inference engine (`DeviceAllocator` with CPU and CUDA implementations,
//! and a `Buffer` that either owns its memory or wraps memory it does not own).
//!
//! The CPU implementation is [`CpuDeviceAllocator`]. A CUDA implementation fits the same trait:
//! its pointers are device addresses carried in a `NonNull<u8>` (never dereferenced on the
//! host), its copies are `cuMemcpy*` calls chosen by [`MemcpyKind`], on a stream when one is
//! given, and waited for when `sync` is true.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::allocator::{AllocError, Allocator, DEFAULT_ALIGNMENT};
use crate::attributes::AllocationAttributes;
use crate::caching::backend::StreamId;
use crate::cpu::CpuAllocator;
use crate::stats::AllocatorStats;

/// Where memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// Host memory.
    Cpu,
    /// Memory of CUDA device `n`.
    Cuda(i32),
}

impl DeviceType {
    /// Whether the host can read and write this memory directly.
    pub fn is_host(self) -> bool {
        matches!(self, DeviceType::Cpu)
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceType::Cpu => f.write_str("cpu"),
            DeviceType::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// The direction of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemcpyKind {
    /// Host memory to host memory.
    HostToHost,
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to host memory.
    DeviceToHost,
    /// Device memory to device memory.
    DeviceToDevice,
}

impl MemcpyKind {
    /// The direction of a copy from memory on `src` to memory on `dst`.
    pub fn between(src: DeviceType, dst: DeviceType) -> MemcpyKind {
        match (src.is_host(), dst.is_host()) {
            (true, true) => MemcpyKind::HostToHost,
            (true, false) => MemcpyKind::HostToDevice,
            (false, true) => MemcpyKind::DeviceToHost,
            (false, false) => MemcpyKind::DeviceToDevice,
        }
    }
}

/// Why a device memory operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceMemoryError {
    /// The allocation failed.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// This allocator cannot perform a copy in this direction.
    #[error("{device} allocator cannot copy {kind:?}")]
    UnsupportedCopy {
        /// The direction asked for.
        kind: MemcpyKind,
        /// The allocator's device.
        device: DeviceType,
    },
    /// Source and destination of a whole-buffer copy differ in size.
    #[error("size mismatch: destination has {dst} bytes, source {src}")]
    SizeMismatch {
        /// Destination bytes.
        dst: usize,
        /// Source bytes.
        src: usize,
    },
    /// A range reaches past the end of a buffer.
    #[error("range {offset}..{offset}+{len} is outside a buffer of {capacity} bytes")]
    OutOfBounds {
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// The buffer's size.
        capacity: usize,
    },
    /// Host access to memory that is not on the host.
    #[error("memory on {0} is not host-accessible")]
    NotHost(DeviceType),
    /// The device (driver) reported an error.
    #[error("device error: {0}")]
    Device(String),
}

/// Allocates, frees, copies and zeroes memory of one device.
pub trait DeviceAllocator: Send + Sync {
    /// The device whose memory this allocator hands out.
    fn device_type(&self) -> DeviceType;

    /// Allocates `size` bytes (a zero-byte request returns a unique pointer that must be
    /// released, as [`Allocator`]'s).
    ///
    /// # Errors
    ///
    /// [`DeviceMemoryError::Alloc`] when memory runs out or a limit is reached.
    fn allocate(&self, size: usize) -> Result<NonNull<u8>, DeviceMemoryError>;

    /// Frees memory from [`allocate`](DeviceAllocator::allocate).
    ///
    /// # Safety
    ///
    /// 1. `ptr` came from `allocate` on this allocator, and
    /// 2. has not been released since, and
    /// 3. is not used after this call (nor by pending work on a stream).
    unsafe fn release(&self, ptr: NonNull<u8>);

    /// Copies `n` bytes from `src` to `dst` in direction `kind`, on `stream` if given (the
    /// device's default stream otherwise), waiting for the copy to finish when `sync` is true.
    /// The regions may overlap for host-to-host copies.
    ///
    /// # Errors
    ///
    /// [`DeviceMemoryError::UnsupportedCopy`] for a direction this allocator cannot do,
    /// [`DeviceMemoryError::Device`] when the device fails.
    ///
    /// # Safety
    ///
    /// 1. `src` is valid for reads of `n` bytes and `dst` for writes of `n` bytes, each on the
    ///    side `kind` names, and
    /// 2. nothing else writes `dst` or `src` until the copy is done.
    unsafe fn memcpy(
        &self,
        dst: NonNull<u8>,
        src: NonNull<u8>,
        n: usize,
        kind: MemcpyKind,
        stream: Option<StreamId>,
        sync: bool,
    ) -> Result<(), DeviceMemoryError>;

    /// Sets `n` bytes at `ptr` to zero, on `stream` if given, waiting when `sync` is true.
    ///
    /// # Errors
    ///
    /// [`DeviceMemoryError::Device`] when the device fails.
    ///
    /// # Safety
    ///
    /// 1. `ptr` is valid for writes of `n` bytes of this allocator's device, and
    /// 2. nothing else uses that memory until the operation is done.
    unsafe fn memset_zero(
        &self,
        ptr: NonNull<u8>,
        n: usize,
        stream: Option<StreamId>,
        sync: bool,
    ) -> Result<(), DeviceMemoryError>;

    /// The allocator's counters, where it keeps them.
    fn stats(&self) -> Option<AllocatorStats> {
        None
    }
}

/// Host memory through a [`CpuAllocator`] (64-byte aligned). Streams are ignored: every
/// operation is done when the call returns.
#[derive(Debug, Default)]
pub struct CpuDeviceAllocator {
    cpu: CpuAllocator,
}

impl CpuDeviceAllocator {
    /// An allocator without a limit.
    pub const fn new() -> CpuDeviceAllocator {
        CpuDeviceAllocator {
            cpu: CpuAllocator::new(),
        }
    }

    /// An allocator over `cpu` (with its limit and stats settings).
    pub const fn from_cpu(cpu: CpuAllocator) -> CpuDeviceAllocator {
        CpuDeviceAllocator { cpu }
    }

    /// The underlying CPU allocator.
    pub fn cpu(&self) -> &CpuAllocator {
        &self.cpu
    }
}

impl DeviceAllocator for CpuDeviceAllocator {
    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }

    fn allocate(&self, size: usize) -> Result<NonNull<u8>, DeviceMemoryError> {
        Ok(self
            .cpu
            .allocate_raw(DEFAULT_ALIGNMENT, size, &AllocationAttributes::default())?)
    }

    unsafe fn release(&self, ptr: NonNull<u8>) {
        // SAFETY: the caller's contract: `ptr` came from `allocate`, i.e. from `self.cpu`.
        unsafe { self.cpu.deallocate_raw(ptr) }
    }

    unsafe fn memcpy(
        &self,
        dst: NonNull<u8>,
        src: NonNull<u8>,
        n: usize,
        kind: MemcpyKind,
        _stream: Option<StreamId>,
        _sync: bool,
    ) -> Result<(), DeviceMemoryError> {
        if kind != MemcpyKind::HostToHost {
            return Err(DeviceMemoryError::UnsupportedCopy {
                kind,
                device: DeviceType::Cpu,
            });
        }
        // SAFETY: the caller guarantees both ranges are valid host memory of `n` bytes;
        // `copy` allows overlap.
        unsafe { std::ptr::copy(src.as_ptr(), dst.as_ptr(), n) };
        Ok(())
    }

    unsafe fn memset_zero(
        &self,
        ptr: NonNull<u8>,
        n: usize,
        _stream: Option<StreamId>,
        _sync: bool,
    ) -> Result<(), DeviceMemoryError> {
        // SAFETY: the caller guarantees `ptr` is valid host memory for `n` bytes of writes.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, n) };
        Ok(())
    }

    fn stats(&self) -> Option<AllocatorStats> {
        self.cpu.stats()
    }
}

/// A run of device memory that knows its device and allocator. An owned buffer frees its
/// memory when dropped; one made by [`Buffer::wrap_unowned`] never does.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use allocview_alloc::device::{Buffer, CpuDeviceAllocator, DeviceAllocator};
///
/// let cpu = Arc::new(CpuDeviceAllocator::new());
/// let mut a = Buffer::new(cpu.clone(), 16).unwrap();
/// a.as_mut_slice().unwrap().copy_from_slice(&[7; 16]);
/// let mut b = Buffer::new(cpu.clone(), 16).unwrap();
/// b.copy_from(&a).unwrap();
/// assert_eq!(b.as_slice().unwrap(), &[7; 16]);
/// drop((a, b));
/// assert_eq!(cpu.stats().unwrap().bytes_in_use, 0);
/// ```
pub struct Buffer {
    ptr: NonNull<u8>,
    len: usize,
    allocator: Arc<dyn DeviceAllocator>,
    owned: bool,
}

// SAFETY: an owned buffer is the only handle to its memory, and an unowned one is made under
// `wrap_unowned`'s contract that the memory stays valid; mutation needs `&mut Buffer`, and the
// allocator is `Send + Sync`.
unsafe impl Send for Buffer {}
// SAFETY: shared access only reads (`as_slice`, copies out of it).
unsafe impl Sync for Buffer {}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("device", &self.device())
            .field("owned", &self.owned)
            .finish()
    }
}

impl Buffer {
    /// Allocates `len` bytes from `allocator`; the buffer frees them when dropped.
    ///
    /// # Errors
    ///
    /// As [`DeviceAllocator::allocate`].
    pub fn new(
        allocator: Arc<dyn DeviceAllocator>,
        len: usize,
    ) -> Result<Buffer, DeviceMemoryError> {
        let ptr = allocator.allocate(len)?;
        Ok(Buffer {
            ptr,
            len,
            allocator,
            owned: true,
        })
    }

    /// A buffer over memory it does not own (a caller's array, a region of another buffer): it
    /// is never freed by the buffer. `allocator` names the memory's device and performs copies.
    ///
    /// # Safety
    ///
    /// 1. `ptr` is valid for reads and writes of `len` bytes on `allocator`'s device for as long
    ///    as the buffer lives, and
    /// 2. nothing else writes that memory while the buffer reads it, or reads or writes it while
    ///    the buffer writes it.
    pub unsafe fn wrap_unowned(
        ptr: NonNull<u8>,
        len: usize,
        allocator: Arc<dyn DeviceAllocator>,
    ) -> Buffer {
        Buffer {
            ptr,
            len,
            allocator,
            owned: false,
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory's device.
    pub fn device(&self) -> DeviceType {
        self.allocator.device_type()
    }

    /// The allocator the buffer belongs to.
    pub fn allocator(&self) -> &Arc<dyn DeviceAllocator> {
        &self.allocator
    }

    /// Whether the buffer frees its memory on drop.
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// Start of the memory (a device address for device buffers).
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The bytes, for host buffers.
    ///
    /// # Errors
    ///
    /// [`DeviceMemoryError::NotHost`] for device memory.
    pub fn as_slice(&self) -> Result<&[u8], DeviceMemoryError> {
        self.host_check()?;
        // SAFETY: host memory valid for `len` bytes (owned: allocated so; unowned: the
        // `wrap_unowned` contract), and `&self` keeps writers out.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The bytes, mutably, for host buffers.
    ///
    /// # Errors
    ///
    /// [`DeviceMemoryError::NotHost`] for device memory.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8], DeviceMemoryError> {
        self.host_check()?;
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only access.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    fn host_check(&self) -> Result<(), DeviceMemoryError> {
        let device = self.device();
        if device.is_host() {
            Ok(())
        } else {
            Err(DeviceMemoryError::NotHost(device))
        }
    }

    /// Copies all of `src` into this buffer, which must be the same size. The direction comes
    /// from the two devices; a device-side allocator performs it (the destination's when both
    /// are devices or both are host).
    ///
    /// # Errors
    ///
    /// [`DeviceMemoryError::SizeMismatch`] if the sizes differ; the allocator's copy errors.
    pub fn copy_from(&mut self, src: &Buffer) -> Result<(), DeviceMemoryError> {
        if src.len != self.len {
            return Err(DeviceMemoryError::SizeMismatch {
                dst: self.len,
                src: src.len,
            });
        }
        self.copy_range_from(0, src, 0, src.len, None, true)
    }

    /// Copies `len` bytes from `src` at `src_offset` to this buffer at `dst_offset`, on
    /// `stream` if given, waiting when `sync` is true.
    ///
    /// # Errors
    ///
    /// [`DeviceMemoryError::OutOfBounds`] if either range passes its buffer's end; the
    /// allocator's copy errors.
    pub fn copy_range_from(
        &mut self,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        len: usize,
        stream: Option<StreamId>,
        sync: bool,
    ) -> Result<(), DeviceMemoryError> {
        check_range(dst_offset, len, self.len)?;
        check_range(src_offset, len, src.len)?;
        let kind = MemcpyKind::between(src.device(), self.device());
        let performer = if !self.device().is_host() || src.device().is_host() {
            &self.allocator
        } else {
            &src.allocator
        };
        // SAFETY: both ranges were checked to lie inside their buffers, whose memory is valid
        // (owned allocations, or the `wrap_unowned` contract); `&mut self` keeps other users of
        // the destination out, and `copy` tolerates overlap between unowned views.
        unsafe {
            performer.memcpy(
                self.ptr.add(dst_offset),
                src.ptr.add(src_offset),
                len,
                kind,
                stream,
                sync,
            )
        }
    }

    /// Sets every byte to zero.
    ///
    /// # Errors
    ///
    /// The allocator's errors.
    pub fn zero(&mut self) -> Result<(), DeviceMemoryError> {
        // SAFETY: the whole buffer is valid memory of the allocator's device, and `&mut self`
        // makes this the only user.
        unsafe { self.allocator.memset_zero(self.ptr, self.len, None, true) }
    }
}

fn check_range(offset: usize, len: usize, capacity: usize) -> Result<(), DeviceMemoryError> {
    match offset.checked_add(len) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(DeviceMemoryError::OutOfBounds {
            offset,
            len,
            capacity,
        }),
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: an owned buffer's pointer came from `allocate` on this allocator and is
            // released exactly once, here.
            unsafe { self.allocator.release(self.ptr) }
        }
    }
}
