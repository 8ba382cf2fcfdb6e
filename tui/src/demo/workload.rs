//! The simulated training run behind `allocview demo`: the allocation pattern of a
//! data-parallel training loop, on the caching allocator.
//!
//! - **Parameters** are allocated once (one large tensor and one small bias per layer).
//! - **Each step** a data-loading stream fills an input batch, which the compute stream then
//!   uses (`record_stream`), so its free stays pending until the compute stream's work
//!   completes; the **forward** pass keeps one activation per layer and frees a workspace
//!   temporary after each layer; the **backward** pass frees the activations in reverse and
//!   allocates gradients; an all-reduce bucket on the communication stream is used across
//!   streams too; the **optimizer** allocates its state (two moments per parameter, as Adam)
//!   on the first step and frees the gradients (`zero_grad(set_to_none=True)`).
//! - Every few steps a **large temporary** (a logits buffer, say) lands mid-forward: the
//!   allocator gets a new large segment for it, and the activations that follow are split
//!   from it, which fragments the large pool.
//! - With [`Scenario::Oom`] the batch grows each step until an allocation fails; the run then
//!   halves the batch and carries on, so the OOM stays on record while the dashboard lives.
//!
//! Sizes scale with the device capacity so the picture looks alike on any `--device-memory`
//! (on a real GPU, with the memory free when the demo starts). The workload runs over either
//! [`DemoDevice`]: on the simulated one it also says when the compute stream's work is queued
//! and done; on CUDA the allocator's events see real completion.
//! Every context switch (`step 41 forward`, `layers.3`) is published as frames through the
//! allocator's context provider. Randomness comes from a seeded SplitMix64: the same seed
//! gives the same run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use allocview_alloc::caching::AllocError;
use allocview_alloc::caching::backend::{DevicePtr, StreamId};
use allocview_alloc::snapshot::{Frame, Frames};

use super::DemoAllocator;
use super::device::DemoDevice;
use crate::cli::Scenario;

/// Layers of the simulated model.
pub const LAYERS: usize = 12;
/// Share of the device the parameters take.
const PARAM_SHARE: f64 = 0.06;
/// Share of the device one layer's activation takes at batch factor 1.
const ACTIVATION_SHARE: f64 = 0.018;
/// Share of the device the occasional large temporary takes.
const TEMPORARY_SHARE: f64 = 0.07;
/// Share of the device an input batch takes.
const BATCH_SHARE: f64 = 0.004;
/// A large temporary every this many steps.
const TEMPORARY_EVERY: u64 = 3;
/// Growth of the batch per step in the OOM scenario.
const OOM_GROWTH: f64 = 1.18;
/// Batch factor after an OOM (the run recovers at a smaller batch).
const AFTER_OOM: f64 = 0.5;
/// Bias (small pool) size per layer.
const BIAS_BYTES: u64 = 96 << 10;
/// Small temporaries (small pool) per layer and pass.
const SMALL_TEMPS: usize = 3;

/// A deterministic random source (SplitMix64).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// Seeded.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A factor in `[lo, hi)`.
    pub fn factor(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
    }
}

/// The context frames the allocator attaches to what it records.
#[derive(Clone, Default)]
pub struct Context(Arc<Mutex<Option<Frames>>>);

impl Context {
    /// Sets the current context: `step 41 forward` and, inside a layer, `layers.3`.
    pub fn set(&self, tag: &str, layer: Option<usize>) {
        let mut frames = vec![Frame {
            name: tag.to_string(),
            filename: "??".into(),
            line: 0,
        }];
        if let Some(l) = layer {
            frames.push(Frame {
                name: format!("layers.{l}"),
                filename: "model.py".into(),
                line: 88,
            });
        }
        frames.push(Frame {
            name: "train".into(),
            filename: "train.py".into(),
            line: 130,
        });
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::from(frames));
    }

    /// The current frames.
    pub fn frames(&self) -> Frames {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(allocview_alloc::snapshot::no_frames)
    }
}

/// What happened in one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepReport {
    /// Allocations made.
    pub allocations: u64,
    /// Allocations that failed for lack of memory.
    pub ooms: u64,
}

/// The training run.
pub struct Workload {
    alloc: Arc<DemoAllocator>,
    device: DemoDevice,
    context: Context,
    rng: SplitMix64,
    scenario: Scenario,
    compute: StreamId,
    data: StreamId,
    capacity: u64,
    params: Vec<DevicePtr>,
    optimizer: Vec<DevicePtr>,
    batch_factor: f64,
    step: u64,
    pace: Option<Duration>,
    /// OOMs so far.
    pub ooms: u64,
}

fn share(capacity: u64, s: f64) -> u64 {
    ((capacity as f64 * s) as u64).max(1)
}

impl Workload {
    /// A run on `alloc` over `device`, with its streams created, sized to `capacity` bytes;
    /// `pace` sleeps between allocator calls so a human can follow.
    ///
    /// # Errors
    /// When the streams cannot be created or the parameters do not fit.
    pub fn new(
        alloc: Arc<DemoAllocator>,
        device: DemoDevice,
        capacity: u64,
        context: Context,
        scenario: Scenario,
        seed: u64,
        pace: Option<Duration>,
    ) -> anyhow::Result<Workload> {
        let compute = StreamId::DEFAULT;
        let data = device.prepare_streams(compute)?;
        let mut w = Workload {
            alloc,
            device,
            context,
            rng: SplitMix64::new(seed),
            scenario,
            compute,
            data,
            capacity,
            params: Vec::new(),
            optimizer: Vec::new(),
            batch_factor: 1.0,
            step: 0,
            pace,
            ooms: 0,
        };
        w.context.set("model init", None);
        let per_layer = share(capacity, PARAM_SHARE / LAYERS as f64);
        for l in 0..LAYERS {
            w.context.set("model init", Some(l));
            let p = w.alloc.malloc(per_layer, compute)?;
            let b = w.alloc.malloc(BIAS_BYTES, compute)?;
            w.params.extend([p, b]);
        }
        Ok(w)
    }

    /// Steps completed.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The data-loading stream.
    pub fn data_stream(&self) -> StreamId {
        self.data
    }

    fn pause(&self) {
        if let Some(p) = self.pace {
            std::thread::sleep(p);
        }
    }

    /// Allocates, counting the report; an OOM is `Ok(None)`.
    fn malloc(
        &mut self,
        size: u64,
        stream: StreamId,
        r: &mut StepReport,
    ) -> anyhow::Result<Option<DevicePtr>> {
        self.pause();
        match self.alloc.malloc(size, stream) {
            Ok(p) => {
                r.allocations += 1;
                Ok(Some(p))
            }
            Err(AllocError::OutOfMemory(_)) => {
                r.ooms += 1;
                self.ooms += 1;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    fn free(&self, p: DevicePtr) -> anyhow::Result<()> {
        self.pause();
        self.alloc.free(p)?;
        Ok(())
    }

    fn free_all(&self, ptrs: &mut Vec<DevicePtr>) -> anyhow::Result<()> {
        while let Some(p) = ptrs.pop() {
            self.free(p)?;
        }
        Ok(())
    }

    /// Runs one training step.
    ///
    /// # Errors
    /// Device errors other than running out of memory.
    pub fn step(&mut self) -> anyhow::Result<StepReport> {
        let mut r = StepReport::default();
        let n = self.step;
        let cap = self.capacity;
        let jitter = self.rng.factor(0.9, 1.1);
        let act = share(cap, ACTIVATION_SHARE * self.batch_factor * jitter);

        // Data loading on its own stream; the compute stream uses the batch.
        self.context.set(&format!("step {n} data"), None);
        let batch = self.malloc(
            share(cap, BATCH_SHARE * self.batch_factor),
            self.data,
            &mut r,
        )?;
        let labels = self.malloc(64 << 10, self.data, &mut r)?;
        for p in [batch, labels].into_iter().flatten() {
            self.alloc.record_stream(p, self.compute)?;
        }
        self.device.submit_work(self.compute);

        // Forward: one activation kept per layer, a workspace freed after each layer.
        let mut acts = Vec::new();
        let mut failed = false;
        for l in 0..LAYERS {
            self.context.set(&format!("step {n} forward"), Some(l));
            match self.malloc(act, self.compute, &mut r)? {
                Some(a) => acts.push(a),
                None => {
                    failed = true;
                    break;
                }
            }
            let ws_size = share(cap, ACTIVATION_SHARE * 0.4 * self.rng.factor(0.5, 1.5));
            let ws = self.malloc(ws_size, self.compute, &mut r)?;
            let mut small = Vec::new();
            for _ in 0..SMALL_TEMPS {
                let s = (self.rng.next_u64() % (256 << 10)) + 512;
                if let Some(p) = self.malloc(s, self.compute, &mut r)? {
                    small.push(p);
                }
            }
            if l == LAYERS / 2 && n % TEMPORARY_EVERY == TEMPORARY_EVERY - 1 {
                let t = self.malloc(share(cap, TEMPORARY_SHARE), self.compute, &mut r)?;
                if let Some(t) = t {
                    self.free(t)?;
                }
            }
            if let Some(ws) = ws {
                self.free(ws)?;
            }
            self.free_all(&mut small)?;
        }
        // The batch is freed by the program now; its memory waits for the compute stream.
        for p in [batch, labels].into_iter().flatten() {
            self.free(p)?;
        }

        // Backward: activations freed in reverse, gradients allocated.
        let mut grads = Vec::new();
        if !failed {
            let per_layer = share(cap, PARAM_SHARE / LAYERS as f64);
            for l in (0..LAYERS).rev() {
                self.context.set(&format!("step {n} backward"), Some(l));
                if let Some(g) = self.malloc(per_layer, self.compute, &mut r)? {
                    grads.push(g);
                }
                if let Some(a) = acts.pop() {
                    self.free(a)?;
                }
            }
            // Gradient all-reduce through a bucket on the communication stream.
            self.context.set(&format!("step {n} all-reduce"), None);
            if let Some(bucket) = self.malloc(share(cap, PARAM_SHARE / 4.0), self.data, &mut r)? {
                self.alloc.record_stream(bucket, self.compute)?;
                self.free(bucket)?;
            }
            // Optimizer: Adam's two moments on the first step; gradients dropped after.
            self.context.set(&format!("step {n} optimizer"), None);
            if self.optimizer.is_empty() {
                let per_layer = share(cap, PARAM_SHARE / LAYERS as f64);
                for _ in 0..2 * LAYERS {
                    if let Some(m) = self.malloc(per_layer, self.compute, &mut r)? {
                        self.optimizer.push(m);
                    }
                }
            }
        }
        self.free_all(&mut acts)?;
        self.free_all(&mut grads)?;
        // The compute stream's work completes: pending frees of the batch and bucket finish.
        self.device.complete_stream(self.compute);

        if failed {
            self.batch_factor *= AFTER_OOM;
        } else if self.scenario == Scenario::Oom {
            self.batch_factor *= OOM_GROWTH;
        }
        self.step += 1;
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use allocview_alloc::caching::history::HistoryOptions;
    use allocview_alloc::caching::{AllocatorConfig, CachingAllocator};

    fn run(scenario: Scenario, steps: u64) -> (Arc<DemoAllocator>, Workload) {
        let device = DemoDevice::open(crate::cli::Backend::Sim, 4 << 30).unwrap();
        let alloc = Arc::new(CachingAllocator::new(
            device.backend(),
            AllocatorConfig::default(),
        ));
        alloc.record_history(HistoryOptions::default());
        let ctx = Context::default();
        let c2 = ctx.clone();
        alloc.set_context_provider(Some(Arc::new(move || c2.frames())));
        let capacity = device.workload_capacity().unwrap();
        let mut w = Workload::new(alloc.clone(), device, capacity, ctx, scenario, 7, None).unwrap();
        for _ in 0..steps {
            w.step().unwrap();
        }
        (alloc, w)
    }

    #[test]
    fn a_training_run_keeps_parameters_and_optimizer_state_and_uses_two_streams() {
        let (alloc, w) = run(Scenario::Train, 4);
        assert_eq!(w.steps(), 4);
        assert_eq!(w.ooms, 0);
        let stats = alloc.device_stats();
        // Parameters, biases and two optimizer moments per layer stay allocated.
        assert_eq!(
            stats.allocation.0[0].current as usize,
            2 * LAYERS + 2 * LAYERS
        );
        let snap = alloc.snapshot();
        assert!(snap.segments.iter().any(|s| s.stream == w.data_stream().0));
        let tags: Vec<String> = snap.device_traces[0]
            .iter()
            .filter_map(|e| e.frames.first().map(|f| f.name.clone()))
            .collect();
        assert!(tags.iter().any(|t| t == "step 2 backward"));
        assert!(tags.iter().any(|t| t == "step 3 optimizer"));
        assert!(stats.num_device_alloc > 0);
    }

    #[test]
    fn the_oom_scenario_runs_out_of_memory_and_recovers() {
        let (alloc, w) = run(Scenario::Oom, 25);
        assert!(w.ooms > 0);
        assert!(alloc.device_stats().num_ooms > 0);
        assert_eq!(w.steps(), 25);
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let (a, _) = run(Scenario::Train, 3);
        let (b, _) = run(Scenario::Train, 3);
        assert_eq!(a.device_stats().currents(), b.device_stats().currents());
        let addrs = |s: &allocview_alloc::snapshot::Snapshot| -> Vec<u64> {
            s.segments.iter().map(|x| x.address).collect()
        };
        assert_eq!(addrs(&a.snapshot()), addrs(&b.snapshot()));
    }
}
