//! [`Runtime`]: the agent plus one lazily opened caching allocator per device, what the C
//! entry points in [`crate::ffi`] work on (one process-wide instance there; tests may start
//! their own).
//!
//! At start the runtime counts the devices (the simulated ones configured, or the CUDA driver's
//! count without opening any device), registers one `DeviceSlot` per device as the agent's
//! snapshot provider, and starts the agent (listening at `ALLOCVIEW_ADDR`, else its default
//! unix socket; OOM dumps in `ALLOCVIEW_DUMP_DIR`). A device's allocator is created on its
//! first allocation and publishes every event into the agent's sink, so `allocview --attach`
//! shows it live.

use std::collections::BTreeMap;
use std::sync::Arc;

use allocview_agent::agent::{Agent, AgentBuilder};
use allocview_agent::provider::SnapshotProvider;
use allocview_alloc::caching::AllocError;
use allocview_alloc::caching::backend::{DevicePtr, StreamId};
use allocview_alloc::event::EventSink;

use crate::device_slot::{DeviceHeap, DeviceSlot};
use crate::settings::{BackendKind, Settings, SettingsError};

/// Why the runtime, or one of its calls, failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RuntimeError {
    /// The environment's settings are wrong.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The CUDA backend was asked for in a build without it.
    #[error(
        "built without CUDA support; rebuild with --features cuda or set ALLOCVIEW_BACKEND=sim"
    )]
    NoCudaSupport,
    /// The CUDA driver could not be loaded or has no device.
    #[error("no CUDA devices: {0}")]
    NoDevices(String),
    /// A device index outside this process's devices.
    #[error("device {device} does not exist: this process has {count} device(s)")]
    NoSuchDevice {
        /// The index asked for.
        device: i32,
        /// How many devices there are.
        count: usize,
    },
    /// A device could not be opened.
    #[error("cannot open device {device}: {message}")]
    Device {
        /// The device.
        device: i32,
        /// Why.
        message: String,
    },
    /// The agent could not start.
    #[error("cannot start the allocview agent: {0}")]
    Agent(String),
    /// A negative size.
    #[error("invalid size {0}: sizes cannot be negative")]
    BadSize(i64),
    /// The caching allocator refused the call (out of memory, unknown pointer, device error).
    #[error("device {device}: {source}")]
    Alloc {
        /// The device.
        device: i32,
        /// The allocator's error.
        source: AllocError,
    },
}

impl RuntimeError {
    /// Whether this is an out-of-memory failure.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            RuntimeError::Alloc {
                source: AllocError::OutOfMemory(_),
                ..
            }
        )
    }
}

/// The agent and the devices. See the [module docs](self).
pub struct Runtime {
    settings: Settings,
    slots: Vec<Arc<DeviceSlot>>,
    sink: Arc<dyn EventSink>,
    agent: Agent,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("backend", &self.settings.backend)
            .field("devices", &self.slots.len())
            .field("agent", &self.agent)
            .finish()
    }
}

impl Runtime {
    /// Counts the devices and starts `agent` (with one provider per device added).
    ///
    /// # Errors
    /// [`RuntimeError::NoCudaSupport`] for the CUDA backend in a build without it;
    /// [`RuntimeError::NoDevices`] when the CUDA driver is missing or sees no device;
    /// [`RuntimeError::Agent`] when the agent cannot start (a bad or busy address).
    pub fn start(settings: Settings, agent: AgentBuilder) -> Result<Runtime, RuntimeError> {
        let count = device_count(&settings.backend)?;
        let known_total = match settings.backend {
            BackendKind::Sim { capacity, .. } => Some(capacity),
            BackendKind::Cuda => None,
        };
        let slots: Vec<Arc<DeviceSlot>> = (0..count)
            .map(|d| Arc::new(DeviceSlot::new(d, known_total)))
            .collect();
        let agent = slots
            .iter()
            .fold(agent, |b, s| {
                b.provider(s.clone() as Arc<dyn SnapshotProvider>)
            })
            .spawn()
            .map_err(|e| RuntimeError::Agent(e.to_string()))?;
        Ok(Runtime {
            settings,
            slots,
            sink: agent.sink(),
            agent,
        })
    }

    /// The embedded agent.
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The settings in use.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Number of devices (opened or not).
    pub fn device_count(&self) -> usize {
        self.slots.len()
    }

    /// Device `device`'s slot; [`RuntimeError::NoSuchDevice`] for a negative or unknown one.
    fn slot(&self, device: i32) -> Result<&DeviceSlot, RuntimeError> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.slots.get(d).map(Arc::as_ref))
            .ok_or(RuntimeError::NoSuchDevice {
                device,
                count: self.slots.len(),
            })
    }

    fn heap(&self, device: i32) -> Result<&Arc<dyn DeviceHeap>, RuntimeError> {
        self.slot(device)?.heap(&self.settings, &self.sink)
    }

    /// Allocates `size` bytes on `device` for use on `stream` (opening the device on first
    /// use). A size of 0 gets no memory: `Ok(None)`, as PyTorch's allocators return null.
    ///
    /// # Errors
    /// [`RuntimeError::BadSize`] for a negative size; the device's opening error; the
    /// allocator's error (out of memory: [`RuntimeError::is_out_of_memory`]).
    pub fn malloc(
        &self,
        size: i64,
        device: i32,
        stream: StreamId,
    ) -> Result<Option<DevicePtr>, RuntimeError> {
        let size = u64::try_from(size).map_err(|_| RuntimeError::BadSize(size))?;
        let heap = self.heap(device)?;
        if size == 0 {
            return Ok(None);
        }
        heap.malloc(size, stream)
            .map(Some)
            .map_err(|source| RuntimeError::Alloc { device, source })
    }

    /// Frees `ptr`, allocated on `device`.
    ///
    /// # Errors
    /// An unknown device; the allocator's error for a pointer it did not hand out.
    pub fn free(&self, ptr: DevicePtr, device: i32) -> Result<(), RuntimeError> {
        self.heap(device)?
            .free(ptr)
            .map_err(|source| RuntimeError::Alloc { device, source })
    }

    /// Returns every opened device's whole free segments to the device.
    ///
    /// # Errors
    /// The first device error (the other devices are still emptied).
    pub fn empty_cache(&self) -> Result<(), RuntimeError> {
        let mut first = Ok(());
        for (device, heap) in self.opened() {
            if let Err(source) = heap.empty_cache()
                && first.is_ok()
            {
                first = Err(RuntimeError::Alloc { device, source });
            }
        }
        first
    }

    /// `torch.cuda.memory_stats(device)` keys for `device` (all zero until it is used).
    ///
    /// # Errors
    /// An unknown device.
    pub fn memory_stats(&self, device: i32) -> Result<BTreeMap<String, i64>, RuntimeError> {
        Ok(match self.slot(device)?.opened() {
            Some(h) => h.memory_stats(),
            None => allocview_alloc::caching::stats::DeviceStats::default().memory_stats(),
        })
    }

    fn opened(&self) -> impl Iterator<Item = (i32, &Arc<dyn DeviceHeap>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(d, s)| s.opened().map(|h| (d as i32, h)))
    }

    /// Stops the agent (last update to clients, socket removed).
    pub fn shutdown(self) {
        self.agent.shutdown();
    }
}

/// How many devices the backend has, without opening any.
fn device_count(backend: &BackendKind) -> Result<i32, RuntimeError> {
    match *backend {
        BackendKind::Sim { devices, .. } => Ok(devices),
        BackendKind::Cuda => cuda_device_count(),
    }
}

#[cfg(feature = "cuda")]
fn cuda_device_count() -> Result<i32, RuntimeError> {
    let n = crate::cuda_devices::count().map_err(RuntimeError::NoDevices)?;
    if n == 0 {
        return Err(RuntimeError::NoDevices(
            "the CUDA driver sees no device (check CUDA_VISIBLE_DEVICES)".into(),
        ));
    }
    Ok(n)
}

#[cfg(not(feature = "cuda"))]
fn cuda_device_count() -> Result<i32, RuntimeError> {
    Err(RuntimeError::NoCudaSupport)
}
