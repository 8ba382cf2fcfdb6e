//! Streams and events as RAII handles: created in the device's primary context, destroyed on
//! drop (with the context bound, from whichever thread drops them).

use std::sync::Arc;

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::result::{self, DriverStatus};

/// A stream created by the backend (`CU_STREAM_NON_BLOCKING`).
#[derive(Debug)]
pub(crate) struct Stream {
    ctx: Arc<PrimaryContext>,
    raw: sys::CUstream,
}

// SAFETY: a CUstream may be used from any thread with its context current; `Stream` only
// passes it to driver calls, binding the context first in `drop`.
unsafe impl Send for Stream {}
// SAFETY: as for `Send`; shared use is only thread-safe driver calls.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream in `ctx` (which must be current on this thread).
    pub(crate) fn create(ctx: &Arc<PrimaryContext>) -> Result<Stream, DriverStatus> {
        let raw = result::stream_create()?;
        Ok(Stream {
            ctx: Arc::clone(ctx),
            raw,
        })
    }

    /// The raw handle (its value is the backend's `StreamId`).
    pub(crate) fn raw(&self) -> sys::CUstream {
        self.raw
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: `raw` was created by `stream_create` and is destroyed only here, once.
        if let Err(status) = unsafe { result::stream_destroy(self.raw) } {
            tracing::warn!(?status, "destroying a CUDA stream failed");
        }
    }
}

/// An event created by the backend (`CU_EVENT_DISABLE_TIMING`).
#[derive(Debug)]
pub(crate) struct Event {
    ctx: Arc<PrimaryContext>,
    raw: sys::CUevent,
}

// SAFETY: a CUevent may be used from any thread; `Event` only passes it to driver calls.
unsafe impl Send for Event {}
// SAFETY: as for `Send`; shared use is only thread-safe driver calls.
unsafe impl Sync for Event {}

impl Event {
    /// A new event in `ctx` (which must be current on this thread).
    pub(crate) fn create(ctx: &Arc<PrimaryContext>) -> Result<Event, DriverStatus> {
        let raw = result::event_create()?;
        Ok(Event {
            ctx: Arc::clone(ctx),
            raw,
        })
    }

    /// The raw handle (its value is the backend's `EventId`).
    pub(crate) fn raw(&self) -> sys::CUevent {
        self.raw
    }

    /// Records the event on `stream` (null: the default stream).
    ///
    /// # Safety
    /// 1. `stream` is null or a live stream of this event's context.
    pub(crate) unsafe fn record(&self, stream: sys::CUstream) -> Result<(), DriverStatus> {
        // SAFETY: `self.raw` is live while `self` is; the caller guarantees `stream`.
        unsafe { result::event_record(self.raw, stream) }
    }

    /// Whether the work before the last record has completed.
    pub(crate) fn query(&self) -> Result<bool, DriverStatus> {
        // SAFETY: `self.raw` is live while `self` is.
        unsafe { result::event_query(self.raw) }
    }

    /// Waits until the work before the last record has completed.
    pub(crate) fn synchronize(&self) -> Result<(), DriverStatus> {
        // SAFETY: `self.raw` is live while `self` is.
        unsafe { result::event_synchronize(self.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: `raw` was created by `event_create` and is destroyed only here, once.
        if let Err(status) = unsafe { result::event_destroy(self.raw) } {
            tracing::warn!(?status, "destroying a CUDA event failed");
        }
    }
}
