//! [`DeviceSlot`]: one device's caching allocator, created on the device's first use, and the
//! agent's [`SnapshotProvider`] for that device.
//!
//! The agent takes its providers when it starts, but a PyTorch process touches devices one by
//! one (a DDP rank only ever its own), and opening a CUDA device costs a context on it. So the
//! runtime registers one slot per device at start and each slot creates its allocator only when
//! the device is first used; until then it reports an empty device. A device that cannot be
//! opened keeps its error, so every later call fails at once with the same reason.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use allocview_agent::provider::SnapshotProvider;
use allocview_alloc::caching::backend::{DeviceBackend, DevicePtr, StreamId};
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::stats::DeviceStats;
use allocview_alloc::caching::{AllocError, CachingAllocator};
use allocview_alloc::event::EventSink;
use allocview_alloc::snapshot::{Frames, Snapshot};

use crate::runtime::RuntimeError;
use crate::settings::{BackendKind, Settings};

/// What the runtime needs of one device's caching allocator, whatever its backend: the calls
/// PyTorch makes, and the agent's [`SnapshotProvider`] (which [`DeviceSlot`] forwards to).
pub(crate) trait DeviceHeap: SnapshotProvider {
    fn malloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError>;
    fn free(&self, ptr: DevicePtr) -> Result<(), AllocError>;
    fn empty_cache(&self) -> Result<(), AllocError>;
    fn memory_stats(&self) -> BTreeMap<String, i64>;
}

impl<B: DeviceBackend + Send + Sync> DeviceHeap for CachingAllocator<B> {
    fn malloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        CachingAllocator::malloc(self, size, stream)
    }
    fn free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        CachingAllocator::free(self, ptr)
    }
    fn empty_cache(&self) -> Result<(), AllocError> {
        CachingAllocator::empty_cache(self)
    }
    fn memory_stats(&self) -> BTreeMap<String, i64> {
        CachingAllocator::memory_stats(self)
    }
}

/// One device: its index, and its allocator once the device has been used.
pub(crate) struct DeviceSlot {
    device: i32,
    /// The device's memory when known without opening it (a simulated device's capacity): the
    /// agent reads it at start, before any device is opened.
    known_total: Option<u64>,
    heap: OnceLock<Result<Arc<dyn DeviceHeap>, RuntimeError>>,
}

impl DeviceSlot {
    pub(crate) fn new(device: i32, known_total: Option<u64>) -> DeviceSlot {
        DeviceSlot {
            device,
            known_total,
            heap: OnceLock::new(),
        }
    }

    /// The allocator, if the device has been opened successfully.
    pub(crate) fn opened(&self) -> Option<&Arc<dyn DeviceHeap>> {
        self.heap.get().and_then(|r| r.as_ref().ok())
    }

    /// The allocator, opening the device on first use (once, even when threads race).
    pub(crate) fn heap(
        &self,
        settings: &Settings,
        sink: &Arc<dyn EventSink>,
    ) -> Result<&Arc<dyn DeviceHeap>, RuntimeError> {
        self.heap
            .get_or_init(|| open(self.device, settings, sink))
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// Opens device `device` on the configured backend, publishing into `sink`.
fn open(
    device: i32,
    settings: &Settings,
    sink: &Arc<dyn EventSink>,
) -> Result<Arc<dyn DeviceHeap>, RuntimeError> {
    let heap: Arc<dyn DeviceHeap> = match settings.backend {
        BackendKind::Sim { capacity, .. } => {
            let backend = SimBackend::builder()
                .capacity(capacity)
                .device(device)
                .build();
            let alloc = CachingAllocator::new(backend, settings.config.clone());
            alloc.set_event_sink(Some(sink.clone()));
            Arc::new(alloc)
        }
        BackendKind::Cuda => open_cuda(device, settings, sink)?,
    };
    tracing::info!(device, backend = ?settings.backend, "allocview: device opened");
    Ok(heap)
}

#[cfg(feature = "cuda")]
fn open_cuda(
    device: i32,
    settings: &Settings,
    sink: &Arc<dyn EventSink>,
) -> Result<Arc<dyn DeviceHeap>, RuntimeError> {
    use allocview_alloc::caching::cuda::CudaBackend;
    let backend = CudaBackend::new(device).map_err(|e| RuntimeError::Device {
        device,
        message: e.to_string(),
    })?;
    let alloc = CachingAllocator::new(backend, settings.config.clone());
    alloc.set_event_sink(Some(sink.clone()));
    Ok(Arc::new(alloc))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(
    _device: i32,
    _settings: &Settings,
    _sink: &Arc<dyn EventSink>,
) -> Result<Arc<dyn DeviceHeap>, RuntimeError> {
    Err(RuntimeError::NoCudaSupport)
}

impl SnapshotProvider for DeviceSlot {
    fn device(&self) -> i32 {
        self.device
    }

    fn snapshot(&self) -> Snapshot {
        self.opened().map(|h| h.snapshot()).unwrap_or_default()
    }

    fn device_stats(&self) -> DeviceStats {
        self.opened().map(|h| h.device_stats()).unwrap_or_default()
    }

    fn snapshot_with_stats(&self) -> Option<(Snapshot, DeviceStats)> {
        self.opened().and_then(|h| h.snapshot_with_stats())
    }

    fn reset_peak_stats(&self) {
        if let Some(h) = self.opened() {
            h.reset_peak_stats();
        }
    }

    fn memory_info(&self) -> Option<(u64, Option<u64>)> {
        self.opened()
            .and_then(|h| h.memory_info())
            .or(self.known_total.map(|total| (total, None)))
    }

    fn flush_events(&self) {
        if let Some(h) = self.opened() {
            h.flush_events();
        }
    }

    fn flush_idle_events(&self) {
        if let Some(h) = self.opened() {
            h.flush_idle_events();
        }
    }

    fn context_frames(&self, ids: &[u32]) -> Vec<(u32, Frames)> {
        self.opened()
            .map(|h| h.context_frames(ids))
            .unwrap_or_default()
    }
}
