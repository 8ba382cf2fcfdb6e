//! `allocview demo`'s engine: a [`device`] (simulated, or a real GPU through CUDA), the caching
//! allocator over it, an embedded agent fed by the allocator's events, and a thread running the
//! training [`workload`] until stopped.

pub mod device;
pub mod workload;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use allocview_agent::agent::Agent;
use allocview_agent::state::{AgentState, is_not_written};
use allocview_alloc::caching::backend::DeviceBackend;
use allocview_alloc::caching::history::{ContextLevel, HistoryOptions};
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};
use anyhow::Context as _;
use serde::Serialize;

use self::device::DemoDevice;
use self::workload::{Context, Workload};
use crate::cli::{Backend, Scenario};

/// The allocator the demo runs, over whichever device it opened.
pub type DemoAllocator = CachingAllocator<Arc<dyn DeviceBackend>>;

/// Trace entries the allocator keeps (its history ring): enough for the dumps' time travel.
pub const HISTORY_ENTRIES: usize = 20_000;
/// The agent's aggregation tick (and the dashboard's update rate).
pub const AGENT_TICK: Duration = Duration::from_millis(100);
/// Sleep between two allocator calls when paced for humans (about two steps a second).
pub const HUMAN_PACE: Duration = Duration::from_millis(4);
/// OOM dumps the demo's agent writes: the OOM scenario fails again every few steps, and each
/// dump is a few MiB; the later OOMs' records say the limit was reached.
pub const DEMO_MAX_DUMPS: u64 = 4;
/// The process name the demo's agent gives attach clients and the dashboard's header (the
/// OOM view knows the demo by it and says how to drive it into an OOM).
pub const DEMO_PROGRAM: &str = "allocview demo";

/// How to run the demo.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// The simulated device or a real GPU.
    pub backend: Backend,
    /// Simulated device memory (ignored on CUDA: the GPU's own memory is used).
    pub capacity: u64,
    /// Allocator settings.
    pub config: AllocatorConfig,
    /// Steady training or a run into an OOM.
    pub scenario: Scenario,
    /// Seed of the workload.
    pub seed: u64,
    /// Sleep between allocator calls (`None`: full speed).
    pub pace: Option<Duration>,
    /// Attach address to serve (`None`: no server).
    pub listen: Option<String>,
    /// Prometheus address.
    pub metrics: Option<SocketAddr>,
    /// Folder for OOM dumps (`None`: the agent's default).
    pub dump_dir: Option<PathBuf>,
    /// Finest resolution of the usage timeline.
    pub sample_interval: Duration,
    /// Stop after this many steps (`None`: run until stopped).
    pub max_steps: Option<u64>,
}

impl DemoConfig {
    /// The defaults of `allocview demo`: a simulated device of `capacity` bytes, default
    /// settings, steady training, paced.
    pub fn new(capacity: u64) -> DemoConfig {
        DemoConfig {
            backend: Backend::Sim,
            capacity,
            config: AllocatorConfig::default(),
            scenario: Scenario::Train,
            seed: 42,
            pace: Some(HUMAN_PACE),
            listen: None,
            metrics: None,
            dump_dir: None,
            sample_interval: Duration::from_millis(250),
            max_steps: None,
        }
    }
}

/// The agent versus the allocator, as `--headless --json` prints it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// The device the workload ran on (`simulated`, `CUDA device 0`).
    pub device: String,
    /// The allocator's settings in PyTorch's syntax (empty: PyTorch's defaults).
    pub settings: String,
    /// Steps completed.
    pub steps: u64,
    /// OOMs the workload met.
    pub ooms: u64,
    /// Seconds the workload ran.
    pub seconds: f64,
    /// The allocator's `memory_stats()`.
    pub stats: std::collections::BTreeMap<String, i64>,
    /// Whether the agent's figures equal the allocator's.
    pub agent_matches_allocator: bool,
    /// The keys whose values differ: `key: agent vs allocator`.
    pub differing_keys: Vec<String>,
    /// Events the agent dropped.
    pub dropped_events: u64,
    /// Times the agent resynchronised from the allocator.
    pub resyncs: u64,
    /// OOM dump files written.
    pub dumps: Vec<String>,
    /// OOM dumps that could not be written (the agent's count).
    pub dump_failures: u64,
    /// Why, per OOM whose record the agent keeps: `OOM N: reason`.
    pub dump_errors: Vec<String>,
    /// Where attach clients connect, when served.
    pub listen: Option<String>,
    /// The signal that stopped the run early (`SIGINT`, `SIGTERM`, `SIGHUP`); absent when it
    /// ran its course.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<String>,
}

/// A running demo.
pub struct Demo {
    /// The embedded agent (shared: `allocview demo` reads its OOM dumps after the dashboard,
    /// which owns the demo, has ended).
    pub agent: Arc<Agent>,
    /// The allocator.
    pub alloc: Arc<DemoAllocator>,
    /// The device under the allocator.
    pub device: DemoDevice,
    scenario: Scenario,
    stop: Arc<AtomicBool>,
    steps: Arc<AtomicU64>,
    ooms: Arc<AtomicU64>,
    error: Arc<Mutex<Option<String>>>,
    worker: Option<JoinHandle<()>>,
    started: Instant,
}

impl Demo {
    /// Starts the device, allocator, agent and workload thread.
    ///
    /// # Errors
    /// The device cannot be opened (`--backend cuda` without CUDA support, a driver or a GPU),
    /// the agent cannot start (a bad or busy listen address), or the model does not fit.
    pub fn start(cfg: DemoConfig) -> anyhow::Result<Demo> {
        let device = DemoDevice::open(cfg.backend, cfg.capacity)?;
        let capacity = device
            .workload_capacity()
            .context("cannot read the device's memory size")?;
        let alloc = Arc::new(CachingAllocator::new(device.backend(), cfg.config.clone()));
        alloc.record_history(HistoryOptions {
            enabled: true,
            context: ContextLevel::All,
            max_entries: HISTORY_ENTRIES,
        });
        let context = Context::default();
        let ctx = context.clone();
        alloc.set_context_provider(Some(Arc::new(move || ctx.frames())));
        let mut builder = Agent::builder()
            .provider(alloc.clone())
            .process_name(DEMO_PROGRAM)
            .tick(AGENT_TICK)
            .max_dumps(DEMO_MAX_DUMPS)
            .sample_interval(cfg.sample_interval);
        builder = match &cfg.listen {
            Some(addr) => builder.listen(addr.clone()),
            None => builder.no_listen(),
        };
        if let Some(m) = cfg.metrics {
            builder = builder.metrics(m);
        }
        if let Some(d) = &cfg.dump_dir {
            builder = builder.dump_dir(d.clone());
        }
        let agent = Arc::new(builder.spawn().context("cannot start the agent")?);
        alloc.set_event_sink(Some(agent.sink()));
        let mut work = Workload::new(
            alloc.clone(),
            device.clone(),
            capacity,
            context,
            cfg.scenario,
            cfg.seed,
            cfg.pace,
        )
        .context(device.too_small())?;
        let stop = Arc::new(AtomicBool::new(false));
        let steps = Arc::new(AtomicU64::new(0));
        let ooms = Arc::new(AtomicU64::new(0));
        let error = Arc::new(Mutex::new(None));
        let (s, n, o, e) = (stop.clone(), steps.clone(), ooms.clone(), error.clone());
        let max = cfg.max_steps;
        let worker = std::thread::Builder::new()
            .name("allocview-demo-workload".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) && max.is_none_or(|m| work.steps() < m) {
                    if let Err(err) = work.step() {
                        *e.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{err:#}"));
                        break;
                    }
                    n.store(work.steps(), Ordering::Relaxed);
                    o.store(work.ooms, Ordering::Relaxed);
                }
            })
            .context("cannot start the workload thread")?;
        Ok(Demo {
            agent,
            alloc,
            device,
            scenario: cfg.scenario,
            stop,
            steps,
            ooms,
            error,
            worker: Some(worker),
            started: Instant::now(),
        })
    }

    /// Steps completed so far.
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::Relaxed)
    }

    /// OOMs met so far.
    pub fn ooms(&self) -> u64 {
        self.ooms.load(Ordering::Relaxed)
    }

    /// The workload's error, if it stopped on one.
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until `steps` steps are done (or the workload ended); false on timeout.
    pub fn wait_for_steps(&self, steps: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.steps() >= steps || self.worker.as_ref().is_none_or(|w| w.is_finished()) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// Stops the workload thread and waits for it.
    pub fn stop_workload(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }

    /// Stops the workload, lets the agent catch up, and compares its figures with the
    /// allocator's.
    pub fn report(&mut self) -> Report {
        self.stop_workload();
        // The flush also waits for the OOM dumps being written.
        self.agent.flush();
        let state = self.agent.state();
        let ours = self.alloc.memory_stats();
        let theirs = state
            .device(self.alloc.device())
            .map(|d| d.stats.memory_stats())
            .unwrap_or_default();
        let differing_keys: Vec<String> = ours
            .iter()
            .filter(|(k, v)| theirs.get(*k) != Some(*v))
            .map(|(k, v)| format!("{k}: agent {:?} vs allocator {v}", theirs.get(k)))
            .collect();
        Report {
            scenario: match self.scenario {
                Scenario::Train => "train".into(),
                Scenario::Oom => "oom".into(),
            },
            device: self.device.name(),
            settings: self.alloc.config().to_conf_string(),
            steps: self.steps(),
            ooms: self.ooms(),
            seconds: self.started.elapsed().as_secs_f64(),
            stats: ours,
            agent_matches_allocator: differing_keys.is_empty(),
            differing_keys,
            dropped_events: state.pipeline.dropped_total,
            resyncs: state.pipeline.resyncs,
            dumps: dump_paths(&state)
                .map(|p| p.display().to_string())
                .collect(),
            dump_failures: state.pipeline.dump_failures,
            dump_errors: dump_errors(&state),
            listen: self.agent.listen_addr().map(|a| a.to_string()),
            interrupted: None,
        }
    }
}

/// The OOM dump files the agent wrote, per OOM whose record it keeps.
pub fn dump_paths(state: &AgentState) -> impl Iterator<Item = &std::path::Path> {
    state
        .ooms
        .iter()
        .flat_map(|o| o.dump_paths.iter().map(|p| p.as_path()))
}

/// Why OOM dumps could not be written, per OOM whose record the agent keeps: `OOM N: reason`
/// (an OOM the agent chose not to dump,
/// [`NOT_WRITTEN`](allocview_agent::state::NOT_WRITTEN), is no failure).
pub fn dump_errors(state: &AgentState) -> Vec<String> {
    state
        .ooms
        .iter()
        .filter_map(|o| {
            let e = o.dump_error.as_ref()?;
            (!is_not_written(e)).then(|| format!("OOM {}: {e}", o.index))
        })
        .collect()
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.stop_workload();
        self.alloc.set_event_sink(None);
    }
}
