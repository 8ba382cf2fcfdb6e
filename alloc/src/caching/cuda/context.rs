//! The device's primary context as an RAII handle: retained on creation, released on drop, made
//! current on whichever thread calls into the backend.

use cudarc::driver::sys;

use super::result::{self, DriverStatus};

/// A retained reference to one device's primary context (the context the CUDA runtime, and so
/// PyTorch, uses for that device; sharing it means pointers and streams are interchangeable
/// with theirs).
#[derive(Debug)]
pub(crate) struct PrimaryContext {
    device: sys::CUdevice,
    ctx: sys::CUcontext,
}

// SAFETY: a CUcontext is a process-wide driver handle, valid on any thread (the driver API is
// thread-safe); `PrimaryContext` only passes it to driver calls.
unsafe impl Send for PrimaryContext {}
// SAFETY: as for `Send`: every use is a thread-safe driver call; nothing is mutated here.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retains `device`'s primary context.
    pub(crate) fn retain(device: sys::CUdevice) -> Result<PrimaryContext, DriverStatus> {
        let ctx = result::primary_ctx_retain(device)?;
        Ok(PrimaryContext { device, ctx })
    }

    /// The driver's device handle.
    pub(crate) fn device(&self) -> sys::CUdevice {
        self.device
    }

    /// Makes the context current on the calling thread (the backend may be called from any
    /// thread; every entry point does this first).
    pub(crate) fn bind(&self) -> Result<(), DriverStatus> {
        // SAFETY: `self.ctx` stays retained until `self` drops.
        unsafe { result::ctx_set_current(self.ctx) }
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: this releases the one reference `retain` took; `self` is going away and every
        // handle that used the context holds an `Arc` to it, so none is left.
        if let Err(status) = unsafe { result::primary_ctx_release(self.device) } {
            tracing::warn!(?status, "releasing the CUDA primary context failed");
        }
    }
}
