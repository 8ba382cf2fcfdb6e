//! Real CUDA under the caching allocator: [`CudaBackend`], the driver API through cudarc.
//!
//! Three layers, as in cudarc itself:
//! 1. raw calls: `cudarc::driver::sys`, which loads `libcuda` at run time, so this builds and
//!    links on machines without CUDA;
//! 2. `result` (private): one function per driver call, status turned into
//!    `Result` with the driver's message (`cuGetErrorString`), out-of-memory into
//!    [`DeviceError::OutOfMemory`];
//! 3. safe RAII handles (private): the primary context, streams, events, address
//!    reservations and mapped physical pages, each released on drop.
//!
//! [`CudaBackend`] holds them and implements [`DeviceBackend`]. Segments are `cuMemAlloc` /
//! `cuMemFree` in the device's primary context (the one the CUDA runtime, and so PyTorch, uses),
//! made current on the calling thread in every entry point, since the allocator may be called
//! from any thread. Expandable segments use the driver's virtual-memory calls:
//! `cuMemAddressReserve`, `cuMemCreate` (pinned device memory) + `cuMemMap` per page,
//! `cuMemSetAccess` (read-write for this device), `cuMemUnmap` + `cuMemRelease`,
//! `cuMemAddressFree`.
//!
//! Never a panic for a missing driver or device: cudarc panics when `libcuda` (or one of its
//! symbols) is missing, so [`CudaBackend::new`] checks for both first and returns
//! [`DeviceError::NoDriver`]; no device gives [`DeviceError::NoDevice`].
//!
//! Ids: a [`StreamId`] is the `CUstream` handle's value (0 = the legacy default stream), an
//! [`EventId`] the `CUevent` handle's value. The backend accepts only the streams and events it
//! created (plus the default stream, and streams registered with
//! [`CudaBackend::register_external_stream`]); anything else is [`DeviceError::Invalid`], so a
//! stale or made-up id never reaches the driver. Likewise `free` only frees pointers this
//! backend's `malloc` returned.

mod context;
mod result;
mod stream;
mod vm;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys;

use self::context::PrimaryContext;
use self::stream::{Event, Stream};
use self::vm::{MappedPage, Reservation};
use crate::caching::backend::{DeviceBackend, DeviceError, DevicePtr, EventId, StreamId};

/// Smallest virtual-memory page the backend uses: 2 MiB, the small-pool segment size, even
/// where the driver's recommended granularity is smaller.
pub const MIN_VM_GRANULARITY: u64 = 2 << 20;

/// Status code reported when the device lacks virtual-memory management
/// (CUDA_ERROR_NOT_SUPPORTED's value).
pub const VM_UNSUPPORTED_ERROR_CODE: i32 = 801;

/// What the backend owns, under one lock.
#[derive(Debug, Default)]
struct Tables {
    /// Live `cuMemAlloc` segments: address -> size.
    segments: BTreeMap<u64, u64>,
    /// Streams this backend created, by handle value.
    streams: HashMap<u64, Arc<Stream>>,
    /// Streams the caller registered (not owned).
    external_streams: HashSet<u64>,
    /// Events this backend created, by handle value.
    events: HashMap<u64, Arc<Event>>,
    /// Address reservations, by first address.
    reservations: BTreeMap<u64, Reservation>,
}

/// A CUDA device under the caching allocator (feature `cuda`). See the [module docs](self).
///
/// # Examples
/// ```no_run
/// use allocview_alloc::caching::backend::DeviceBackend;
/// use allocview_alloc::caching::cuda::CudaBackend;
///
/// match CudaBackend::new(0) {
///     Ok(gpu) => {
///         let ptr = gpu.malloc(2 << 20).unwrap();
///         gpu.free(ptr).unwrap();
///     }
///     Err(err) => eprintln!("no GPU here: {err}"),
/// }
/// ```
#[derive(Debug)]
pub struct CudaBackend {
    ordinal: i32,
    /// Everything the backend created; dropped (and so destroyed) before the context.
    tables: Mutex<Tables>,
    /// The virtual-memory page size, or why the device cannot do virtual memory.
    vm: Result<u64, DeviceError>,
    ctx: Arc<PrimaryContext>,
}

impl CudaBackend {
    /// Opens CUDA device `device_ordinal` (as in `cuda:N`), in its primary context.
    ///
    /// # Errors
    /// - [`DeviceError::NoDriver`] when `libcuda` cannot be loaded or is too old;
    /// - [`DeviceError::NoDevice`] when the driver sees no device, or not this one;
    /// - any other driver failure while initialising.
    pub fn new(device_ordinal: i32) -> Result<CudaBackend, DeviceError> {
        result::driver_available()?;
        result::init()?;
        let count = result::device_count()?;
        if device_ordinal < 0 || device_ordinal >= count {
            return Err(DeviceError::NoDevice(format!(
                "CUDA device {device_ordinal} does not exist: the driver sees {count} device(s) \
                 (check CUDA_VISIBLE_DEVICES)"
            )));
        }
        let device = result::device_get(device_ordinal)?;
        let ctx = Arc::new(PrimaryContext::retain(device)?);
        ctx.bind()?;
        let vm = Self::probe_vm(device_ordinal, device);
        if let Err(err) = &vm {
            tracing::info!(%err, "CUDA device {device_ordinal}: no virtual memory, so no expandable segments");
        }
        Ok(CudaBackend {
            ordinal: device_ordinal,
            tables: Mutex::new(Tables::default()),
            vm,
            ctx,
        })
    }

    /// The virtual-memory granularity (recommended, at least [`MIN_VM_GRANULARITY`]), or why
    /// the device has none.
    fn probe_vm(ordinal: i32, device: sys::CUdevice) -> Result<u64, DeviceError> {
        let supported = result::device_attribute(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
        )?;
        if supported == 0 {
            return Err(DeviceError::Driver {
                code: VM_UNSUPPORTED_ERROR_CODE,
                message: format!(
                    "CUDA device {ordinal} does not support virtual memory management \
                     (cuMemCreate / cuMemMap), so expandable segments are unavailable"
                ),
            });
        }
        let recommended = result::allocation_granularity(device)? as u64;
        if recommended == 0 {
            return Err(DeviceError::Driver {
                code: VM_UNSUPPORTED_ERROR_CODE,
                message: format!("CUDA device {ordinal} reports a virtual-memory granularity of 0"),
            });
        }
        // Doubling keeps it a multiple of the driver's granularity.
        let mut granularity = recommended;
        while granularity < MIN_VM_GRANULARITY {
            granularity *= 2;
        }
        Ok(granularity)
    }

    /// Lets `record_event` use a stream this backend did not create (a stream of the same
    /// device's primary context, e.g. one PyTorch or another library made). Returns its id.
    ///
    /// # Safety
    /// 1. `raw` is the value of a live `CUstream` of this device's primary context.
    /// 2. It stays live for as long as events may be recorded on it through this backend.
    pub unsafe fn register_external_stream(&self, raw: u64) -> StreamId {
        if raw != StreamId::DEFAULT.0 {
            self.tables().external_streams.insert(raw);
        }
        StreamId(raw)
    }

    /// Sets `len` bytes at `ptr` to `value` and waits until done. The range must lie inside
    /// one live segment of this backend, or be entirely mapped inside one reservation: a
    /// debugging aid (poison freed memory, prove a mapping is writable), never a way to touch
    /// memory the backend does not own.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] for a range the backend does not own; driver errors.
    pub fn memset(&self, ptr: DevicePtr, value: u8, len: u64) -> Result<(), DeviceError> {
        let bytes = to_usize("memset", len)?;
        let _tables = self.owned_range("memset", ptr, len)?;
        self.bind()?;
        // SAFETY: `owned_range` checked that the range is allocated and accessible memory of
        // this context, and holding the table lock keeps it from being freed or unmapped
        // through this backend until the synchronize below has finished the write.
        unsafe { result::memset_d8(ptr, value, bytes) }?;
        result::ctx_synchronize()?;
        Ok(())
    }

    /// Copies `out.len()` bytes at `ptr` into `out`. The same ownership rule as
    /// [`memset`](Self::memset).
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] for a range the backend does not own; driver errors.
    pub fn copy_to_host(&self, ptr: DevicePtr, out: &mut [u8]) -> Result<(), DeviceError> {
        let _tables = self.owned_range("copy_to_host", ptr, out.len() as u64)?;
        self.bind()?;
        // SAFETY: `owned_range` checked the range is allocated and accessible memory of this
        // context; the table lock keeps it so for the (synchronous) copy.
        unsafe { result::memcpy_dtoh(out, ptr) }?;
        Ok(())
    }

    /// Locks the tables and checks that `[ptr, ptr + len)` is memory this backend owns.
    fn owned_range(
        &self,
        what: &str,
        ptr: DevicePtr,
        len: u64,
    ) -> Result<MutexGuard<'_, Tables>, DeviceError> {
        let tables = self.tables();
        let range: Range<u64> = ptr..ptr
            .checked_add(len)
            .ok_or_else(|| DeviceError::Invalid(format!("{what}({ptr:#x}, {len}): overflows")))?;
        let in_segment = tables
            .segments
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&start, &size)| range.end <= start + size);
        let mapped = || {
            let g = self.vm_granularity();
            let Some((_, res)) = tables.reservations.range(..=ptr).next_back() else {
                return false;
            };
            if range.end > res.va() + res.size() {
                return false;
            }
            let first = ptr - ptr % g;
            let pages = (range.end - first).div_ceil(g);
            res.pages.range(first..range.end).count() as u64 == pages
        };
        if len == 0 || !(in_segment || mapped()) {
            return Err(DeviceError::Invalid(format!(
                "{what}({ptr:#x}, {len}): not inside one live segment or mapped range of this \
                 backend"
            )));
        }
        Ok(tables)
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        // Every update leaves the tables consistent before anything can panic.
        self.tables
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes the context current on the calling thread.
    fn bind(&self) -> Result<(), DeviceError> {
        self.ctx.bind().map_err(DeviceError::from)
    }

    fn vm_granularity_or_err(&self) -> Result<u64, DeviceError> {
        self.vm.clone()
    }

    fn check_vm_range(&self, what: &str, va: u64, size: u64) -> Result<u64, DeviceError> {
        let g = self.vm_granularity_or_err()?;
        if size == 0 || !size.is_multiple_of(g) || !va.is_multiple_of(g) {
            return Err(DeviceError::Invalid(format!(
                "{what}({va:#x}, {size}): address and size must be multiples of the \
                 granularity ({g} bytes), size positive"
            )));
        }
        if va.checked_add(size).is_none() {
            return Err(DeviceError::Invalid(format!(
                "{what}({va:#x}, {size}): overflows"
            )));
        }
        Ok(g)
    }
}

/// The reservation containing `[va, va + size)`, if one does.
fn containing_reservation(
    reservations: &mut BTreeMap<u64, Reservation>,
    va: u64,
    size: u64,
) -> Option<&mut Reservation> {
    let (_, res) = reservations.range_mut(..=va).next_back()?;
    (va + size <= res.va() + res.size()).then_some(res)
}

fn to_usize(what: &str, size: u64) -> Result<usize, DeviceError> {
    usize::try_from(size)
        .map_err(|_| DeviceError::Invalid(format!("{what}({size}): too large for this host")))
}

impl DeviceBackend for CudaBackend {
    fn device(&self) -> i32 {
        self.ordinal
    }

    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        if size == 0 {
            return Err(DeviceError::Invalid("malloc of 0 bytes".into()));
        }
        let bytes = to_usize("malloc", size)?;
        self.bind()?;
        let ptr = result::mem_alloc(bytes).map_err(|s| s.into_device_error(size))?;
        self.tables().segments.insert(ptr, size);
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let Some(size) = self.tables().segments.remove(&ptr) else {
            return Err(DeviceError::Invalid(format!(
                "free({ptr:#x}): not a live segment of this backend (never allocated here, an \
                 interior pointer, or a double free)"
            )));
        };
        let freed = self.bind().and_then(|()| {
            // SAFETY: `ptr` came from `mem_alloc` (it was in `segments`) and was removed from
            // the table above, so it is freed once. The allocator frees a segment only when no
            // block in it is in use.
            unsafe { result::mem_free(ptr) }.map_err(DeviceError::from)
        });
        if freed.is_err() {
            // The driver kept it: so do we.
            self.tables().segments.insert(ptr, size);
        }
        freed
    }

    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.bind()?;
        let (free, total) = result::mem_get_info()?;
        Ok((free as u64, total as u64))
    }

    fn create_stream(&self) -> Result<StreamId, DeviceError> {
        self.bind()?;
        let stream = Stream::create(&self.ctx)?;
        let id = stream.raw() as u64;
        self.tables().streams.insert(id, Arc::new(stream));
        Ok(StreamId(id))
    }

    fn create_event(&self) -> Result<EventId, DeviceError> {
        self.bind()?;
        let event = Event::create(&self.ctx)?;
        let id = event.raw() as u64;
        self.tables().events.insert(id, Arc::new(event));
        Ok(EventId(id))
    }

    fn destroy_event(&self, event: EventId) -> Result<(), DeviceError> {
        let removed = self.tables().events.remove(&event.0);
        match removed {
            // Dropping the last `Arc` destroys it (after any query another thread is making).
            Some(handle) => {
                drop(handle);
                Ok(())
            }
            None => Err(unknown_event("destroy_event", event)),
        }
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), DeviceError> {
        let (handle, owned_stream, raw_stream) = {
            let tables = self.tables();
            let handle = tables
                .events
                .get(&event.0)
                .cloned()
                .ok_or_else(|| unknown_event("record_event", event))?;
            let owned = tables.streams.get(&stream.0).cloned();
            let raw: sys::CUstream = if let Some(s) = &owned {
                s.raw()
            } else if stream == StreamId::DEFAULT || tables.external_streams.contains(&stream.0) {
                stream.0 as usize as sys::CUstream
            } else {
                return Err(DeviceError::Invalid(format!(
                    "record_event: unknown stream {stream} (not created by this backend nor \
                     registered)"
                )));
            };
            (handle, owned, raw)
        };
        self.bind()?;
        // SAFETY: `raw_stream` is null (the default stream), a stream this backend created and
        // keeps alive (`owned_stream` holds it for this call), or a registered external stream
        // its registrant keeps alive; all belong to this context.
        let recorded = unsafe { handle.record(raw_stream) };
        drop(owned_stream);
        recorded.map_err(DeviceError::from)
    }

    fn query_event(&self, event: EventId) -> Result<bool, DeviceError> {
        let handle = self.event(event, "query_event")?;
        self.bind()?;
        handle.query().map_err(DeviceError::from)
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), DeviceError> {
        let handle = self.event(event, "synchronize_event")?;
        self.bind()?;
        handle.synchronize().map_err(DeviceError::from)
    }

    fn synchronize_device(&self) -> Result<(), DeviceError> {
        self.bind()?;
        result::ctx_synchronize().map_err(DeviceError::from)
    }

    fn vm_granularity(&self) -> u64 {
        self.vm.as_ref().copied().unwrap_or(MIN_VM_GRANULARITY)
    }

    fn vm_reserve(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let g = self.vm_granularity_or_err()?;
        if size == 0 || !size.is_multiple_of(g) {
            return Err(DeviceError::Invalid(format!(
                "vm_reserve({size}): the size must be a positive multiple of the granularity \
                 ({g} bytes)"
            )));
        }
        to_usize("vm_reserve", size)?;
        self.bind()?;
        let reservation =
            Reservation::reserve(&self.ctx, size, g).map_err(|s| s.into_device_error(size))?;
        let va = reservation.va();
        self.tables().reservations.insert(va, reservation);
        Ok(va)
    }

    fn vm_map(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let g = self.check_vm_range("vm_map", va, size)?;
        to_usize("vm_map", size)?;
        let mut tables = self.tables();
        let res = containing_reservation(&mut tables.reservations, va, size).ok_or_else(|| {
            DeviceError::Invalid(format!(
                "vm_map({va:#x}, {size}): the range is not inside one reserved range"
            ))
        })?;
        if let Some((&mapped, _)) = res.pages.range(va..va + size).next() {
            return Err(DeviceError::Invalid(format!(
                "vm_map({va:#x}, {size}): the page at {mapped:#x} is already mapped"
            )));
        }
        self.bind()?;
        let prop = result::pinned_device_prop(self.ctx.device());
        let mut pages = Vec::new();
        for page_va in (va..va + size).step_by(g as usize) {
            // SAFETY: `[page_va, page_va + g)` lies inside `res` (checked above), nothing is
            // mapped there (checked above, and the pages mapped so far in this loop are
            // earlier ones), and `g` is a multiple of the driver's granularity for `prop`.
            match unsafe { MappedPage::map(&self.ctx, page_va, g, &prop) } {
                Ok(page) => pages.push(page),
                // Dropping `pages` unmaps what this call mapped.
                Err(status) => return Err(status.into_device_error(size)),
            }
        }
        // SAFETY: every page of `[va, va + size)` was just mapped.
        unsafe { result::mem_set_access_read_write(va, size as usize, self.ctx.device()) }
            .map_err(|s| s.into_device_error(size))?;
        for page in pages {
            res.pages.insert(page.va(), page);
        }
        Ok(())
    }

    fn vm_unmap(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let g = self.check_vm_range("vm_unmap", va, size)?;
        let mut tables = self.tables();
        let res = containing_reservation(&mut tables.reservations, va, size).ok_or_else(|| {
            DeviceError::Invalid(format!(
                "vm_unmap({va:#x}, {size}): the range is not inside one reserved range"
            ))
        })?;
        let mapped = res.pages.range(va..va + size).count() as u64;
        if mapped != size / g {
            return Err(DeviceError::Invalid(format!(
                "vm_unmap({va:#x}, {size}): the range is not entirely mapped"
            )));
        }
        self.bind()?;
        let mut first_error = None;
        for page_va in (va..va + size).step_by(g as usize) {
            if let Some(page) = res.pages.remove(&page_va)
                && let Err(status) = page.unmap()
            {
                first_error.get_or_insert(status);
            }
        }
        match first_error {
            Some(status) => Err(status.into()),
            None => Ok(()),
        }
    }

    fn vm_release(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let mut tables = self.tables();
        let Some(res) = tables.reservations.get(&va) else {
            return Err(DeviceError::Invalid(format!(
                "vm_release({va:#x}, {size}): no reservation starts at this address"
            )));
        };
        if res.size() != size {
            return Err(DeviceError::Invalid(format!(
                "vm_release({va:#x}, {size}): the reservation at this address is {} bytes; \
                 release it whole",
                res.size()
            )));
        }
        if let Some((&mapped, _)) = res.pages.iter().next() {
            return Err(DeviceError::Invalid(format!(
                "vm_release({va:#x}, {size}): the page at {mapped:#x} is still mapped; unmap it \
                 first"
            )));
        }
        self.bind()?;
        match tables.reservations.remove(&va) {
            Some(res) => res.release().map_err(DeviceError::from),
            None => Ok(()),
        }
    }
}

impl CudaBackend {
    fn event(&self, event: EventId, what: &str) -> Result<Arc<Event>, DeviceError> {
        self.tables()
            .events
            .get(&event.0)
            .cloned()
            .ok_or_else(|| unknown_event(what, event))
    }
}

fn unknown_event(what: &str, event: EventId) -> DeviceError {
    DeviceError::Invalid(format!(
        "{what}: unknown event {:#x} (not created by this backend, or destroyed)",
        event.0
    ))
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        let tables = self
            .tables
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (&ptr, _) in tables.segments.iter() {
            // SAFETY: every pointer in `segments` came from `mem_alloc` and was not freed
            // (`free` removes it first); the table is dropped with the backend, so each is
            // freed once. The allocator owning this backend has gone, so nothing uses them.
            if let Err(status) = unsafe { result::mem_free(ptr) } {
                tracing::warn!(?status, ptr, "freeing a leftover CUDA segment failed");
            }
        }
        tables.segments.clear();
        // Events, streams and reservations are destroyed by their own drops, before `ctx`.
    }
}
