//! The device under `allocview demo`: the simulated one, or a real GPU through the CUDA driver
//! (feature `cuda`).
//!
//! The caching allocator sees either as a `dyn DeviceBackend`. What differs is how stream work
//! completes. On the simulated device nothing runs, so the workload says when work is queued
//! on the compute stream ([`DemoDevice::submit_work`]) and when it is done
//! ([`DemoDevice::complete_stream`]); until then, frees of blocks used on that stream stay
//! pending, as behind real kernels. On CUDA completion is real: the allocator records events
//! and queries them, and the two hooks do nothing.

use std::sync::Arc;

use allocview_alloc::caching::backend::{DeviceBackend, DeviceError, StreamId};
#[cfg(feature = "cuda")]
use allocview_alloc::caching::cuda::CudaBackend;
use allocview_alloc::caching::sim::SimBackend;

use crate::cli::Backend;

/// The CUDA device the demo opens (`cuda:0`).
pub const CUDA_DEVICE_ORDINAL: i32 = 0;

/// Why `--backend cuda` is refused by a build without the `cuda` feature.
pub const NO_CUDA_SUPPORT: &str = "built without CUDA support; rebuild with --features cuda";

/// The device under the demo's allocator.
#[derive(Debug, Clone)]
pub enum DemoDevice {
    /// The simulated device; the workload paces its streams.
    Sim(Arc<SimBackend>),
    /// A real GPU; stream work completes by itself.
    #[cfg(feature = "cuda")]
    Cuda(Arc<CudaBackend>),
}

impl DemoDevice {
    /// Opens the device `backend` names: a simulated device of `capacity` bytes, or CUDA
    /// device [`CUDA_DEVICE_ORDINAL`] (whose own memory is used; `capacity` is ignored).
    ///
    /// # Errors
    /// `--backend cuda` in a build without the `cuda` feature ([`NO_CUDA_SUPPORT`]); no CUDA
    /// driver, no device, or any driver failure while opening it.
    pub fn open(backend: Backend, capacity: u64) -> anyhow::Result<DemoDevice> {
        match backend {
            Backend::Sim => Ok(DemoDevice::Sim(Arc::new(SimBackend::new(capacity)))),
            #[cfg(feature = "cuda")]
            Backend::Cuda => match CudaBackend::new(CUDA_DEVICE_ORDINAL) {
                Ok(gpu) => Ok(DemoDevice::Cuda(Arc::new(gpu))),
                Err(e) => Err(anyhow::anyhow!(
                    "cannot open CUDA device {CUDA_DEVICE_ORDINAL}: {e}"
                )),
            },
            #[cfg(not(feature = "cuda"))]
            Backend::Cuda => Err(anyhow::anyhow!(NO_CUDA_SUPPORT)),
        }
    }

    /// The device as the allocator sees it.
    pub fn backend(&self) -> Arc<dyn DeviceBackend> {
        match self {
            DemoDevice::Sim(sim) => sim.clone(),
            #[cfg(feature = "cuda")]
            DemoDevice::Cuda(gpu) => gpu.clone(),
        }
    }

    /// What the dashboard's header calls the device.
    pub fn name(&self) -> String {
        match self {
            DemoDevice::Sim(_) => "simulated".into(),
            #[cfg(feature = "cuda")]
            DemoDevice::Cuda(gpu) => format!("CUDA device {}", gpu.device()),
        }
    }

    /// What to say when the model's parameters do not fit.
    pub fn too_small(&self) -> &'static str {
        match self {
            DemoDevice::Sim(_) => {
                "the model does not fit on the simulated device: give more --device-memory"
            }
            #[cfg(feature = "cuda")]
            DemoDevice::Cuda(_) => "the model does not fit in the GPU's free memory",
        }
    }

    /// The memory the workload scales itself to: the simulated device's capacity, or what is
    /// free on the GPU when the demo starts (other programs may hold the rest).
    ///
    /// # Errors
    /// The driver cannot say how much memory is free.
    pub fn workload_capacity(&self) -> Result<u64, DeviceError> {
        match self {
            DemoDevice::Sim(sim) => Ok(sim.capacity()),
            #[cfg(feature = "cuda")]
            DemoDevice::Cuda(gpu) => Ok(gpu.mem_get_info()?.0),
        }
    }

    /// Creates the workload's second stream (data loading and communication) next to
    /// `compute`; on the simulated device, also puts stream completion under the workload's
    /// control.
    ///
    /// # Errors
    /// The device cannot create a stream.
    pub fn prepare_streams(&self, compute: StreamId) -> Result<StreamId, DeviceError> {
        match self {
            DemoDevice::Sim(sim) => {
                let data = sim.create_stream()?;
                sim.add_stream(compute);
                sim.set_auto_complete(false);
                Ok(data)
            }
            #[cfg(feature = "cuda")]
            DemoDevice::Cuda(gpu) => gpu.create_stream(),
        }
    }

    /// Work is queued on `stream` (simulated device only: real work queues itself).
    pub fn submit_work(&self, stream: StreamId) {
        match self {
            DemoDevice::Sim(sim) => sim.submit_work(stream),
            #[cfg(feature = "cuda")]
            DemoDevice::Cuda(_) => {}
        }
    }

    /// The work queued on `stream` has completed (simulated device only: on a GPU the
    /// allocator's events report real completion).
    pub fn complete_stream(&self, stream: StreamId) {
        match self {
            DemoDevice::Sim(sim) => sim.complete_stream(stream),
            #[cfg(feature = "cuda")]
            DemoDevice::Cuda(_) => {}
        }
    }
}
