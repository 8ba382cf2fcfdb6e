//! The middle FFI layer: each CUDA driver call the backend makes, as a function that turns the
//! driver's status into `Result<_, DeviceError>` (cudarc's `driver::result` pattern).
//!
//! The raw calls are `cudarc::driver::sys`, which loads `libcuda` at run time. Two cudarc traps
//! shape this layer: the loader PANICS when the library or one of its symbols is missing, so
//! [`driver_available`] checks both before anything here is called; and a status is a Rust
//! enum, so every call goes through [`check`], which names the call and asks the driver for its
//! message (`cuGetErrorString`).
//!
//! Functions that only create things, or read through out-pointers to locals, are safe. Those
//! that take a handle or device address are `unsafe`: handing the driver a handle that was
//! destroyed, or an address something else still uses, is unsound even where the driver would
//! notice.

use std::ffi::{CStr, c_void};
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr;

use cudarc::driver::sys;

use crate::caching::backend::DeviceError;

/// Every driver entry point the backend calls, by the symbol name cudarc loads. Checked once in
/// [`driver_available`], so a driver too old to have one gives an error instead of cudarc's
/// "Missing symbol" panic.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemsetD8_v2",
    "cuMemcpyDtoH_v2",
];

/// Whether libcuda can be loaded and has every entry point the backend uses; the reason when
/// not. Nothing else in this module may be called before this returned `Ok`.
///
/// # Errors
/// [`DeviceError::NoDriver`] naming what is missing.
pub(crate) fn driver_available() -> Result<(), DeviceError> {
    // SAFETY: `is_culib_present` only tries to open the library with libloading; opening
    // libcuda runs its initialisers, which is what every CUDA program does.
    if !unsafe { sys::is_culib_present() } {
        return Err(DeviceError::NoDriver(
            "libcuda.so could not be loaded (no NVIDIA driver installed, or it is not on the \
             loader path: check LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    // SAFETY: the library is present (checked above), so `culib` returns it instead of
    // panicking.
    let lib = unsafe { sys::culib() };
    for name in REQUIRED_SYMBOLS {
        // SAFETY: the symbol is only looked up, never called through this type.
        let found = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) };
        if found.is_err() {
            return Err(DeviceError::NoDriver(format!(
                "libcuda has no {name}: the NVIDIA driver is too old (CUDA 12 or newer needed)"
            )));
        }
    }
    Ok(())
}

/// A driver status other than success, with the call that returned it. Its `Debug` shows the
/// driver's own message.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct DriverStatus {
    /// The driver call, e.g. `"cuMemAlloc"`.
    pub(crate) call: &'static str,
    /// What it returned.
    pub(crate) status: sys::CUresult,
}

impl DriverStatus {
    /// The driver's description of the status (`cuGetErrorString`).
    pub(crate) fn message(&self) -> String {
        let mut text: *const std::ffi::c_char = ptr::null();
        // SAFETY: `text` is a valid out-pointer; the driver stores a pointer to a static string.
        let status = unsafe { sys::cuGetErrorString(self.status, &mut text) };
        if status != sys::CUresult::CUDA_SUCCESS || text.is_null() {
            return format!("unrecognised CUDA status {}", self.code());
        }
        // SAFETY: on success `text` points to a NUL-terminated string the driver owns for the
        // life of the process.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    /// The numeric status code.
    pub(crate) fn code(&self) -> i32 {
        self.status as i32
    }

    /// The backend's error for this status: out-of-memory keeps the size asked for, missing
    /// drivers and devices, bad arguments, and the rest with the driver's code and message.
    pub(crate) fn into_device_error(self, size: u64) -> DeviceError {
        use sys::CUresult as R;
        let text = format!("{}: {:?} ({})", self.call, self.status, self.message());
        match self.status {
            R::CUDA_ERROR_OUT_OF_MEMORY => DeviceError::OutOfMemory { size },
            R::CUDA_ERROR_NO_DEVICE | R::CUDA_ERROR_INVALID_DEVICE => DeviceError::NoDevice(text),
            R::CUDA_ERROR_STUB_LIBRARY
            | R::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
            | R::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => DeviceError::NoDriver(text),
            R::CUDA_ERROR_INVALID_VALUE | R::CUDA_ERROR_INVALID_HANDLE => {
                DeviceError::Invalid(text)
            }
            _ => DeviceError::Driver {
                code: self.code(),
                message: text,
            },
        }
    }
}

impl fmt::Debug for DriverStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DriverStatus")
            .field("call", &self.call)
            .field("status", &self.status)
            .field("message", &self.message())
            .finish()
    }
}

impl From<DriverStatus> for DeviceError {
    fn from(status: DriverStatus) -> DeviceError {
        status.into_device_error(0)
    }
}

/// `Ok` for `CUDA_SUCCESS`, else the status with the call's name.
pub(crate) fn check(call: &'static str, status: sys::CUresult) -> Result<(), DriverStatus> {
    if status == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DriverStatus { call, status })
    }
}

/// `cuInit(0)`.
pub(crate) fn init() -> Result<(), DriverStatus> {
    // SAFETY: cuInit takes no pointers; `driver_available` succeeded before this module is used.
    check("cuInit", unsafe { sys::cuInit(0) })
}

/// `cuDeviceGetCount`.
pub(crate) fn device_count() -> Result<i32, DriverStatus> {
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer.
    check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    })?;
    Ok(count)
}

/// `cuDeviceGet`.
pub(crate) fn device_get(ordinal: i32) -> Result<sys::CUdevice, DriverStatus> {
    let mut device = 0;
    // SAFETY: `device` is a valid out-pointer.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut device, ordinal)
    })?;
    Ok(device)
}

/// `cuDeviceGetAttribute`.
pub(crate) fn device_attribute(
    device: sys::CUdevice,
    attribute: sys::CUdevice_attribute,
) -> Result<i32, DriverStatus> {
    let mut value = 0;
    // SAFETY: `value` is a valid out-pointer; a bad device is reported as a status.
    check("cuDeviceGetAttribute", unsafe {
        sys::cuDeviceGetAttribute(&mut value, attribute, device)
    })?;
    Ok(value)
}

/// `cuDevicePrimaryCtxRetain`: the device's primary context (the one the CUDA runtime, and so
/// PyTorch, uses), with its reference count raised.
pub(crate) fn primary_ctx_retain(device: sys::CUdevice) -> Result<sys::CUcontext, DriverStatus> {
    let mut ctx = MaybeUninit::uninit();
    // SAFETY: `ctx` is a valid out-pointer, initialised by the driver on success.
    check("cuDevicePrimaryCtxRetain", unsafe {
        sys::cuDevicePrimaryCtxRetain(ctx.as_mut_ptr(), device)
    })?;
    // SAFETY: the call succeeded, so the driver wrote the context.
    Ok(unsafe { ctx.assume_init() })
}

/// `cuDevicePrimaryCtxRelease`.
///
/// # Safety
/// 1. This releases one reference taken by [`primary_ctx_retain`] for `device`, once.
/// 2. Nothing uses the context through that reference afterwards.
pub(crate) unsafe fn primary_ctx_release(device: sys::CUdevice) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1 and 2.
    check("cuDevicePrimaryCtxRelease", unsafe {
        sys::cuDevicePrimaryCtxRelease_v2(device)
    })
}

/// `cuCtxSetCurrent`: makes `ctx` current on the calling thread.
///
/// # Safety
/// 1. `ctx` is a live context (retained and not released).
pub(crate) unsafe fn ctx_set_current(ctx: sys::CUcontext) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
}

/// `cuCtxSynchronize`: waits for all work in the current context.
pub(crate) fn ctx_synchronize() -> Result<(), DriverStatus> {
    // SAFETY: no arguments; without a current context the driver returns an error status.
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
}

/// `cuMemAlloc`: `size` bytes of device memory in the current context.
pub(crate) fn mem_alloc(size: usize) -> Result<sys::CUdeviceptr, DriverStatus> {
    let mut ptr = 0;
    // SAFETY: `ptr` is a valid out-pointer.
    check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, size) })?;
    Ok(ptr)
}

/// `cuMemFree`.
///
/// # Safety
/// 1. `ptr` was returned by [`mem_alloc`] and not freed since.
/// 2. No queued or future device work uses it.
pub(crate) unsafe fn mem_free(ptr: sys::CUdeviceptr) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1 and 2.
    check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) })
}

/// `cuMemGetInfo`: `(free, total)` bytes on the current context's device.
pub(crate) fn mem_get_info() -> Result<(usize, usize), DriverStatus> {
    let (mut free, mut total) = (0, 0);
    // SAFETY: both are valid out-pointers.
    check("cuMemGetInfo", unsafe {
        sys::cuMemGetInfo_v2(&mut free, &mut total)
    })?;
    Ok((free, total))
}

/// `cuStreamCreate` with `CU_STREAM_NON_BLOCKING` (PyTorch's side streams do not synchronise
/// with the legacy default stream either).
pub(crate) fn stream_create() -> Result<sys::CUstream, DriverStatus> {
    let mut stream = MaybeUninit::uninit();
    // SAFETY: `stream` is a valid out-pointer, initialised by the driver on success.
    check("cuStreamCreate", unsafe {
        sys::cuStreamCreate(
            stream.as_mut_ptr(),
            sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
        )
    })?;
    // SAFETY: the call succeeded.
    Ok(unsafe { stream.assume_init() })
}

/// `cuStreamDestroy`.
///
/// # Safety
/// 1. `stream` was created by [`stream_create`] and not destroyed since.
/// 2. Nothing uses the handle afterwards.
pub(crate) unsafe fn stream_destroy(stream: sys::CUstream) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1 and 2.
    check("cuStreamDestroy", unsafe {
        sys::cuStreamDestroy_v2(stream)
    })
}

/// `cuEventCreate` with `CU_EVENT_DISABLE_TIMING` (as PyTorch's allocator: cheaper, and it
/// never reads times).
pub(crate) fn event_create() -> Result<sys::CUevent, DriverStatus> {
    let mut event = MaybeUninit::uninit();
    // SAFETY: `event` is a valid out-pointer, initialised by the driver on success.
    check("cuEventCreate", unsafe {
        sys::cuEventCreate(
            event.as_mut_ptr(),
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    })?;
    // SAFETY: the call succeeded.
    Ok(unsafe { event.assume_init() })
}

/// `cuEventDestroy`.
///
/// # Safety
/// 1. `event` was created by [`event_create`] and not destroyed since.
/// 2. Nothing uses the handle afterwards.
pub(crate) unsafe fn event_destroy(event: sys::CUevent) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1 and 2.
    check("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(event) })
}

/// `cuEventRecord`.
///
/// # Safety
/// 1. `event` is a live event and `stream` a live stream (or null, the default stream) of the
///    same context.
pub(crate) unsafe fn event_record(
    event: sys::CUevent,
    stream: sys::CUstream,
) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1.
    check("cuEventRecord", unsafe {
        sys::cuEventRecord(event, stream)
    })
}

/// `cuEventQuery`: `true` when the recorded work completed, `false` while it is pending.
///
/// # Safety
/// 1. `event` is a live event.
pub(crate) unsafe fn event_query(event: sys::CUevent) -> Result<bool, DriverStatus> {
    // SAFETY: the caller guarantees 1.
    match unsafe { sys::cuEventQuery(event) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        status => Err(DriverStatus {
            call: "cuEventQuery",
            status,
        }),
    }
}

/// `cuEventSynchronize`.
///
/// # Safety
/// 1. `event` is a live event.
pub(crate) unsafe fn event_synchronize(event: sys::CUevent) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1.
    check("cuEventSynchronize", unsafe {
        sys::cuEventSynchronize(event)
    })
}

/// Properties of the physical memory expandable segments map: pinned device memory on
/// `device`, no shareable handle.
pub(crate) fn pinned_device_prop(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: ptr::null_mut::<c_void>(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// `cuMemGetAllocationGranularity` (recommended) for pinned memory on `device`.
pub(crate) fn allocation_granularity(device: sys::CUdevice) -> Result<usize, DriverStatus> {
    let prop = pinned_device_prop(device);
    let mut granularity = 0;
    // SAFETY: `granularity` is a valid out-pointer and `prop` a valid, fully initialised
    // property struct that outlives the call.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
        )
    })?;
    Ok(granularity)
}

/// `cuMemAddressReserve`: `size` bytes of virtual address space, anywhere, aligned to
/// `alignment`.
pub(crate) fn address_reserve(
    size: usize,
    alignment: usize,
) -> Result<sys::CUdeviceptr, DriverStatus> {
    let mut va = 0;
    // SAFETY: `va` is a valid out-pointer; address 0 and flags 0 let the driver choose.
    check("cuMemAddressReserve", unsafe {
        sys::cuMemAddressReserve(&mut va, size, alignment, 0, 0)
    })?;
    Ok(va)
}

/// `cuMemAddressFree`.
///
/// # Safety
/// 1. `[va, va + size)` is exactly a range [`address_reserve`] returned, not freed since.
/// 2. Nothing is mapped inside it.
pub(crate) unsafe fn address_free(va: sys::CUdeviceptr, size: usize) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1 and 2.
    check("cuMemAddressFree", unsafe {
        sys::cuMemAddressFree(va, size)
    })
}

/// `cuMemCreate`: `size` bytes of physical memory with `prop`.
pub(crate) fn mem_create(
    size: usize,
    prop: &sys::CUmemAllocationProp,
) -> Result<sys::CUmemGenericAllocationHandle, DriverStatus> {
    let mut handle = 0;
    // SAFETY: `handle` is a valid out-pointer; `prop` is a valid reference for the call.
    check("cuMemCreate", unsafe {
        sys::cuMemCreate(&mut handle, size, prop, 0)
    })?;
    Ok(handle)
}

/// `cuMemRelease`.
///
/// # Safety
/// 1. `handle` came from [`mem_create`] and was not released since.
pub(crate) unsafe fn mem_release(
    handle: sys::CUmemGenericAllocationHandle,
) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1.
    check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
}

/// `cuMemMap`: maps all of `handle` (`size` bytes) at `va`.
///
/// # Safety
/// 1. `[va, va + size)` lies inside a live reservation and nothing is mapped there.
/// 2. `handle` is live and `size` bytes long.
pub(crate) unsafe fn mem_map(
    va: sys::CUdeviceptr,
    size: usize,
    handle: sys::CUmemGenericAllocationHandle,
) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1 and 2.
    check("cuMemMap", unsafe { sys::cuMemMap(va, size, 0, handle, 0) })
}

/// `cuMemUnmap`.
///
/// # Safety
/// 1. `[va, va + size)` is exactly one mapping made by [`mem_map`].
/// 2. No queued or future device work uses it.
pub(crate) unsafe fn mem_unmap(va: sys::CUdeviceptr, size: usize) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1 and 2.
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(va, size) })
}

/// `cuMemSetAccess`: read-write access to `[va, va + size)` from `device`.
///
/// # Safety
/// 1. `[va, va + size)` is entirely mapped.
pub(crate) unsafe fn mem_set_access_read_write(
    va: sys::CUdeviceptr,
    size: usize,
    device: sys::CUdevice,
) -> Result<(), DriverStatus> {
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the caller guarantees 1; `desc` is one valid descriptor that outlives the call.
    check("cuMemSetAccess", unsafe {
        sys::cuMemSetAccess(va, size, &desc, 1)
    })
}

/// `cuMemsetD8`: sets `len` bytes at `ptr` to `value` (queued on the legacy default stream).
///
/// # Safety
/// 1. `[ptr, ptr + len)` is device memory of the current context, allocated and accessible.
/// 2. Nothing else uses those bytes meanwhile.
pub(crate) unsafe fn memset_d8(
    ptr: sys::CUdeviceptr,
    value: u8,
    len: usize,
) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1 and 2.
    check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(ptr, value, len) })
}

/// `cuMemcpyDtoH`: copies `out.len()` bytes from `ptr` into `out` (synchronous).
///
/// # Safety
/// 1. `[ptr, ptr + out.len())` is device memory of the current context, allocated and
///    accessible.
pub(crate) unsafe fn memcpy_dtoh(
    out: &mut [u8],
    ptr: sys::CUdeviceptr,
) -> Result<(), DriverStatus> {
    // SAFETY: the caller guarantees 1; `out` is a valid, writable host buffer of `out.len()`
    // bytes for the whole (synchronous) call.
    check("cuMemcpyDtoH", unsafe {
        sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast::<c_void>(), ptr, out.len())
    })
}
