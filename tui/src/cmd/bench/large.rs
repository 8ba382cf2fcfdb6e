//! A large, PyTorch-shaped snapshot made by allocview's own caching allocator on the simulated
//! device, deterministically: what `torch.cuda.memory._record_memory_history(max_entries=N)`
//! with full Python + C++ stacks records over a training run that ends in an out-of-memory
//! error. The input of `snapshot.large_load`, and of `examples/large_snapshot.rs` (which writes
//! it to a file for the big-file tour).
//!
//! The run: `persistent_large` parameter and optimizer tensors of 10 to 16 MiB (each its own
//! large-pool segment) and `persistent_small` buffers of 600 KiB to 1 MiB (small-pool
//! segments, two per segment), all kept; then `steps` training steps over `layers` layers,
//! each layer's forward allocating a few activations of mixed sizes on one of `streams`
//! streams and the backward freeing them in reverse order, one in [`KEEP_ONE_IN`] kept past its
//! step (caches that fragment the pools); finally one request larger than the device, which
//! fails and is recorded as an `oom` entry. History is on with context level `All` and ring size
//! `max_entries`, so every entry has the frames of where it happened, innermost first: C++
//! allocator and ATen frames, CPython interpreter frames between Python frames, modules
//! nested as `nn.Module._call_impl` nests them: about 30 to 60 frames. The entries' wall-clock
//! timestamps are replaced by a fixed clock ([`CLOCK_START_US`], one entry every
//! [`CLOCK_STEP_US`]), so the snapshot is the same every run.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, ContextLevel, HistoryOptions};
use allocview_alloc::snapshot::{Frame, Frames, Snapshot};
use anyhow::{Context, bail};

use crate::units::MIB;

/// One in this many activations outlives its step.
pub const KEEP_ONE_IN: u64 = 29;

/// The fixed clock the entries' timestamps are set to (microseconds since the Unix epoch of
/// the first entry), so the snapshot is the same bytes every run.
pub const CLOCK_START_US: i64 = 1_763_800_000_000_000;

/// Microseconds between two entries on the fixed clock.
pub const CLOCK_STEP_US: i64 = 50;

/// The size of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LargeSpec {
    /// Device capacity in bytes.
    pub capacity: u64,
    /// Trace ring size (`max_entries`).
    pub max_entries: usize,
    /// Parameter and optimizer tensors of 10-16 MiB, one large segment each.
    pub persistent_large: usize,
    /// Buffers of 600 KiB-1 MiB, two per small segment.
    pub persistent_small: usize,
    /// Training steps.
    pub steps: usize,
    /// Layers per step.
    pub layers: usize,
    /// Streams the work is spread over (the default stream included).
    pub streams: u64,
}

impl LargeSpec {
    /// The bench row's run: tens of thousands of trace entries, about a thousand segments,
    /// a few megabytes of pickle (small enough for a short default run).
    pub const BENCH: LargeSpec = LargeSpec {
        capacity: 80 << 30,
        max_entries: 20_000,
        persistent_large: 600,
        persistent_small: 800,
        steps: 40,
        layers: 48,
        streams: 4,
    };

    /// The tour's run: an 80 GiB device, `max_entries=100000` (PyTorch's documented
    /// recommendation) filled and overflowed, thousands of segments, eight streams.
    pub const TOUR: LargeSpec = LargeSpec {
        capacity: 80 << 30,
        max_entries: 100_000,
        persistent_large: 3_000,
        persistent_small: 8_000,
        steps: 200,
        layers: 48,
        streams: 8,
    };
}

/// A deterministic xorshift64* generator (no dependency, same sequence everywhere).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `lo..hi` (`hi > lo`).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// Where a call comes from: the parts the stack is built of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
struct Site {
    /// Phase: 0 setup, 1 forward, 2 backward, 3 optimizer.
    phase: u8,
    /// Kind of layer (attention, mlp, norm, ...).
    layer_kind: u8,
    /// How deep the modules nest.
    nest: u8,
    /// The tensor operation.
    op: u8,
    /// Which line of the layer's forward.
    line: u8,
}

/// Python files of the model and training script.
const USER_FILES: [&str; 4] = [
    "/workspace/llm/train.py",
    "/workspace/llm/trainer/loop.py",
    "/workspace/llm/model/transformer.py",
    "/workspace/llm/model/layers.py",
];

/// Layer kinds: class-like names used in frame names.
const LAYER_KINDS: [&str; 8] = [
    "CausalSelfAttention",
    "RotaryEmbedding",
    "SwiGLU",
    "RMSNorm",
    "TransformerBlock",
    "Embedding",
    "LMHead",
    "MoERouter",
];

/// Tensor operations: Python function, its file, and the ATen op.
const OPS: [(&str, &str, &str); 10] = [
    (
        "linear",
        "/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py",
        "at::_ops::linear::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)",
    ),
    (
        "scaled_dot_product_attention",
        "/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py",
        "at::_ops::_scaled_dot_product_flash_attention::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, double, bool, bool, std::optional<double>)",
    ),
    (
        "silu",
        "/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py",
        "at::_ops::silu::call(at::Tensor const&)",
    ),
    (
        "softmax",
        "/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py",
        "at::_ops::_softmax::call(at::Tensor const&, long, bool)",
    ),
    (
        "rms_norm",
        "/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py",
        "at::_ops::rms_norm::call(at::Tensor const&, c10::ArrayRef<c10::SymInt>, std::optional<at::Tensor> const&, std::optional<double>)",
    ),
    (
        "embedding",
        "/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py",
        "at::_ops::embedding::call(at::Tensor const&, at::Tensor const&, c10::SymInt, bool, bool)",
    ),
    (
        "cat",
        "/workspace/llm/model/layers.py",
        "at::_ops::cat::call(c10::IListRef<at::Tensor> const&, long)",
    ),
    (
        "matmul",
        "/workspace/llm/model/layers.py",
        "at::_ops::matmul::call(at::Tensor const&, at::Tensor const&)",
    ),
    (
        "backward",
        "/opt/conda/lib/python3.11/site-packages/torch/autograd/__init__.py",
        "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)",
    ),
    (
        "step",
        "/opt/conda/lib/python3.11/site-packages/torch/optim/adamw.py",
        "at::_ops::_foreach_addcdiv_::call(c10::ArrayRef<at::Tensor>, c10::ArrayRef<at::Tensor>, c10::ArrayRef<at::Tensor>, c10::ArrayRef<c10::Scalar>)",
    ),
];

/// The C++ frames every allocation starts with (innermost first), from the allocator up.
const ALLOCATOR_FRAMES: [(&str, &str, i64); 6] = [
    (
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)",
        "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
        1323,
    ),
    (
        "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)",
        "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
        3610,
    ),
    (
        "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
        "/pytorch/c10/cuda/CUDACachingAllocator.cpp",
        3741,
    ),
    (
        "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)",
        "/pytorch/aten/src/ATen/EmptyTensor.cpp",
        58,
    ),
    (
        "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, std::optional<c10::MemoryFormat>)",
        "/pytorch/aten/src/ATen/cuda/EmptyTensor.cpp",
        23,
    ),
    (
        "at::native::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)",
        "/pytorch/aten/src/ATen/native/cuda/TensorFactories.cu",
        52,
    ),
];

/// The C++ frames of the CPython interpreter between two Python frames.
const INTERPRETER_FRAMES: [&str; 3] = [
    "_PyEval_EvalFrameDefault",
    "_PyFunction_Vectorcall",
    "PyObject_Call",
];

/// `torch.nn.Module`'s file.
const MODULE_FILE: &str = "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py";

/// The frames of a call from `site`, innermost first.
fn stack(site: Site) -> Vec<Frame> {
    let mut f = Vec::with_capacity(64);
    for (name, file, line) in ALLOCATOR_FRAMES {
        f.push(Frame::new(name, file, line));
    }
    let (py_name, py_file, aten) = OPS[site.op as usize % OPS.len()];
    f.push(Frame::new(aten, "??", 0));
    f.push(Frame::new(
        "torch::autograd::THPVariable_wrap(at::TensorBase)",
        "/pytorch/torch/csrc/autograd/python_variable.cpp",
        i64::from(site.op) * 7 + 120,
    ));
    let interp = |f: &mut Vec<Frame>| {
        for name in INTERPRETER_FRAMES {
            f.push(Frame::new(name, "??", 0));
        }
    };
    interp(&mut f);
    f.push(Frame::new(py_name, py_file, 2100 + i64::from(site.op) * 37));
    let kind = LAYER_KINDS[site.layer_kind as usize % LAYER_KINDS.len()];
    match site.phase {
        2 => {
            interp(&mut f);
            f.push(Frame::new(
                "_engine_run_backward",
                "/opt/conda/lib/python3.11/site-packages/torch/autograd/graph.py",
                825,
            ));
            f.push(Frame::new(
                "backward",
                "/opt/conda/lib/python3.11/site-packages/torch/autograd/__init__.py",
                347,
            ));
            f.push(Frame::new(
                "backward",
                "/opt/conda/lib/python3.11/site-packages/torch/_tensor.py",
                626,
            ));
        }
        3 => {
            interp(&mut f);
            f.push(Frame::new(
                "_multi_tensor_adamw",
                "/opt/conda/lib/python3.11/site-packages/torch/optim/adamw.py",
                590,
            ));
            f.push(Frame::new(
                "adamw",
                "/opt/conda/lib/python3.11/site-packages/torch/optim/adamw.py",
                335,
            ));
            f.push(Frame::new(
                "step",
                "/opt/conda/lib/python3.11/site-packages/torch/optim/adamw.py",
                209,
            ));
            f.push(Frame::new(
                "wrapper",
                "/opt/conda/lib/python3.11/site-packages/torch/optim/optimizer.py",
                487,
            ));
        }
        _ => {
            interp(&mut f);
            f.push(Frame::new(
                format!("{kind}.forward"),
                USER_FILES[3],
                40 + i64::from(site.layer_kind) * 60 + i64::from(site.line),
            ));
            for level in 0..site.nest {
                // `module(x)` from Python: `tp_call` into the interpreter, then three frames.
                f.push(Frame::new("_PyObject_MakeTpCall", "??", 0));
                f.push(Frame::new("_PyEval_EvalFrameDefault", "??", 0));
                f.push(Frame::new("_call_impl", MODULE_FILE, 1747));
                f.push(Frame::new("_wrapped_call_impl", MODULE_FILE, 1736));
                let outer = LAYER_KINDS
                    [(site.layer_kind as usize + level as usize + 4) % LAYER_KINDS.len()];
                f.push(Frame::new(
                    format!("{outer}.forward"),
                    USER_FILES[2],
                    100 + i64::from(level) * 31 + i64::from(site.line % 4),
                ));
            }
        }
    }
    interp(&mut f);
    f.push(Frame::new(
        "train_step",
        USER_FILES[1],
        212 + i64::from(site.phase) * 9,
    ));
    interp(&mut f);
    f.push(Frame::new("fit", USER_FILES[1], 88));
    interp(&mut f);
    f.push(Frame::new("main", USER_FILES[0], 412));
    f.push(Frame::new("<module>", USER_FILES[0], 430));
    f.push(Frame::new("_PyRun_SimpleFileObject", "??", 0));
    f.push(Frame::new("Py_BytesMain", "??", 0));
    f.push(Frame::new("__libc_start_main", "??", 0));
    f
}

/// The stack of the call about to be made, shared with the allocator's context provider.
#[derive(Debug, Default)]
struct CallContext {
    site: Site,
    /// Every stack made so far, by site (a real run's tracebacks of one site are equal).
    cache: HashMap<Site, Frames>,
}

impl CallContext {
    fn frames(&mut self) -> Frames {
        let site = self.site;
        self.cache
            .entry(site)
            .or_insert_with(|| Arc::from(stack(site)))
            .clone()
    }
}

/// Runs the training run of `spec` on a fresh simulated device and returns its snapshot
/// (PyTorch's `_snapshot()` after the OOM).
pub fn generate(spec: &LargeSpec) -> anyhow::Result<Snapshot> {
    let sim = SimBackend::new(spec.capacity);
    for s in 1..spec.streams {
        sim.add_stream(StreamId(s));
    }
    let alloc = CachingAllocator::new(sim, AllocatorConfig::default());
    let ctx = Arc::new(Mutex::new(CallContext::default()));
    let provider_ctx = Arc::clone(&ctx);
    alloc.set_context_provider(Some(Arc::new(move || {
        provider_ctx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .frames()
    })));
    alloc.record_history(HistoryOptions {
        enabled: true,
        context: ContextLevel::All,
        max_entries: spec.max_entries,
    });
    let set_site = |site: Site| ctx.lock().unwrap_or_else(PoisonError::into_inner).site = site;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let streams = spec.streams.max(1);

    let mut kept = Vec::with_capacity(spec.persistent_large + spec.persistent_small);
    for i in 0..spec.persistent_large {
        set_site(Site {
            phase: if i % 3 == 0 { 0 } else { 3 },
            layer_kind: (i % LAYER_KINDS.len()) as u8,
            nest: (i % 4) as u8,
            op: if i % 3 == 0 { 0 } else { 9 },
            line: (i % 7) as u8,
        });
        let size = rng.range(10 * MIB, 16 * MIB);
        kept.push(
            alloc
                .malloc(size, StreamId::DEFAULT)
                .with_context(|| format!("allocating parameter {i} ({size} bytes)"))?,
        );
    }
    for i in 0..spec.persistent_small {
        set_site(Site {
            phase: 0,
            layer_kind: (i % LAYER_KINDS.len()) as u8,
            nest: (i % 5) as u8,
            op: (i % 6) as u8,
            line: (i % 11) as u8,
        });
        let size = rng.range(600 << 10, MIB);
        kept.push(
            alloc
                .malloc(size, StreamId(i as u64 % streams))
                .with_context(|| format!("allocating buffer {i} ({size} bytes)"))?,
        );
    }

    let mut activations = Vec::new();
    for step in 0..spec.steps {
        for layer in 0..spec.layers {
            let kind = (layer % LAYER_KINDS.len()) as u8;
            let stream = StreamId((layer as u64 + step as u64) % streams);
            let count = 2 + rng.range(0, 5);
            for k in 0..count {
                set_site(Site {
                    phase: 1,
                    layer_kind: kind,
                    nest: 1 + (layer % 5) as u8,
                    op: rng.range(0, 8) as u8,
                    line: k as u8,
                });
                let size = match rng.range(0, 10) {
                    0..=4 => rng.range(512, 256 << 10),
                    5..=7 => rng.range(MIB, 9 * MIB),
                    _ => rng.range(12 * MIB, 40 * MIB),
                };
                match alloc.malloc(size, stream) {
                    Ok(p) => activations.push(p),
                    Err(e) => bail!("step {step} layer {layer}: activation of {size} bytes: {e}"),
                }
            }
        }
        // Backward: newest first.
        while let Some(p) = activations.pop() {
            if rng.range(0, KEEP_ONE_IN) == 0 && kept.len() < spec.persistent_large * 4 {
                kept.push(p);
                continue;
            }
            set_site(Site {
                phase: 2,
                layer_kind: (activations.len() % LAYER_KINDS.len()) as u8,
                nest: 0,
                op: 8,
                line: 0,
            });
            alloc.free(p).context("freeing an activation")?;
        }
    }
    set_site(Site {
        phase: 1,
        layer_kind: 6,
        nest: 2,
        op: 0,
        line: 3,
    });
    if alloc.malloc(spec.capacity, StreamId::DEFAULT).is_ok() {
        bail!("a request of the whole device succeeded; the run cannot end in an OOM");
    }
    let mut snapshot = alloc.snapshot();
    drop(kept);
    for trace in &mut snapshot.device_traces {
        for (i, e) in trace.iter_mut().enumerate() {
            e.time_us = Some(CLOCK_START_US + i as i64 * CLOCK_STEP_US);
        }
    }
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run small enough for a debug test.
    const TINY: LargeSpec = LargeSpec {
        capacity: 80 << 30,
        max_entries: 500,
        persistent_large: 20,
        persistent_small: 30,
        steps: 4,
        layers: 12,
        streams: 3,
    };

    #[test]
    fn the_run_fills_the_ring_with_deep_stacks_and_ends_in_an_oom() {
        let s = generate(&TINY).unwrap();
        let trace = s.device_traces.last().unwrap();
        assert_eq!(trace.len(), TINY.max_entries);
        assert!(s.devices[0].trace_overflow > 0);
        assert!(trace.iter().any(|e| e.action.as_str() == "oom"));
        let depths: Vec<usize> = trace.iter().map(|e| e.frames.len()).collect();
        assert!(
            depths
                .iter()
                .filter(|&&d| d > 0)
                .all(|&d| (30..=60).contains(&d)),
            "{depths:?}"
        );
        let streams: std::collections::BTreeSet<u64> = trace.iter().map(|e| e.stream).collect();
        assert_eq!(streams.len() as u64, TINY.streams);
        assert!(s.segments.len() > TINY.persistent_large);
    }

    #[test]
    fn the_run_is_the_same_every_time() {
        assert_eq!(generate(&TINY).unwrap(), generate(&TINY).unwrap());
    }
}
