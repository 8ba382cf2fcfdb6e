//! The C interface: what PyTorch's `CUDAPluggableAllocator` loads, plus helpers for tests and
//! users.
//!
//! ```c
//! void* allocview_malloc(ssize_t size, int device, cudaStream_t stream);
//! void  allocview_free(void* ptr, ssize_t size, int device, cudaStream_t stream);
//! void  allocview_empty_cache(void);
//! char* allocview_memory_stats_json(int device);   /* free with allocview_string_free */
//! void  allocview_string_free(char* s);
//! ```
//!
//! The first call of any of them starts the process-wide [`Runtime`] from the environment
//! ([`Settings::from_env`], the agent's own variables). No call ever unwinds into C: each body
//! runs under `catch_unwind`, and a panic, like any other failure, becomes a null return (or
//! nothing, for the `void` functions) and a line on stderr, once per kind of failure
//! ([`FailureLog`]).

use std::ffi::{CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::ptr;
use std::sync::OnceLock;

use allocview_agent::agent::Agent;
use allocview_agent::server::ListenAddr;
use allocview_alloc::caching::backend::StreamId;

use crate::failure_log::{Failure, FailureLog};
use crate::runtime::{Runtime, RuntimeError};
use crate::settings::Settings;

/// The process-wide runtime (or why it could not start; it is not retried).
static RUNTIME: OnceLock<Result<Runtime, RuntimeError>> = OnceLock::new();

/// Failures of the C entry points.
static FAILURES: FailureLog = FailureLog::new();

/// The unix socket to remove when the process exits.
static SOCKET_PATH: OnceLock<PathBuf> = OnceLock::new();

/// The failure counters of the C entry points (how many of each kind so far).
pub fn failures() -> &'static FailureLog {
    &FAILURES
}

/// The process-wide runtime, started on first use.
///
/// # Errors
/// Why it could not start (the same error on every call).
pub fn runtime() -> Result<&'static Runtime, RuntimeError> {
    RUNTIME
        .get_or_init(|| {
            let started = Settings::from_env()
                .map_err(RuntimeError::from)
                .and_then(|s| Runtime::start(s, Agent::builder()));
            if let Ok(rt) = &started {
                if let Some(ListenAddr::Unix(path)) = rt.agent().listen_addr() {
                    remove_socket_at_exit(path.clone());
                }
                tracing::info!(target: "allocview", runtime = ?rt, "allocview: started");
            }
            started
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Runs `body`, turning a panic into `fallback` (counted and logged once).
fn guarded<T>(fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            FAILURES.report(Failure::Panic, &what);
            fallback
        }
    }
}

/// The runtime, or null-worthy: logs a start failure once.
fn runtime_or_report() -> Option<&'static Runtime> {
    match runtime() {
        Ok(rt) => Some(rt),
        Err(e) => {
            FAILURES.report(Failure::Start, &e);
            None
        }
    }
}

fn failure_kind(e: &RuntimeError) -> Failure {
    match e {
        _ if e.is_out_of_memory() => Failure::OutOfMemory,
        RuntimeError::NoSuchDevice { .. } | RuntimeError::Device { .. } => Failure::Device,
        _ => Failure::Malloc,
    }
}

/// Allocates `size` bytes of device memory on `device` for use on `stream` (PyTorch's
/// `CUDAPluggableAllocator` malloc).
///
/// Returns null for a size of 0, and on any failure: out of memory (PyTorch then reports the
/// allocation failure), a negative size, an unknown or unavailable device, a library that could
/// not start. The reason is printed to stderr the first time each kind of failure happens.
#[allow(unsafe_code)] // `no_mangle` exports the symbol; the function itself is safe.
#[unsafe(no_mangle)]
pub extern "C" fn allocview_malloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    guarded(ptr::null_mut(), || {
        let Some(rt) = runtime_or_report() else {
            return ptr::null_mut();
        };
        match rt.malloc(size as i64, device, StreamId(stream as u64)) {
            Ok(Some(p)) => p as *mut c_void,
            Ok(None) => ptr::null_mut(),
            Err(e) => {
                FAILURES.report(failure_kind(&e), &e);
                ptr::null_mut()
            }
        }
    })
}

/// Frees `ptr`, which [`allocview_malloc`] returned for `device` (PyTorch's
/// `CUDAPluggableAllocator` free). `size` and `stream` are those of the allocation, as PyTorch
/// passes them; the allocator knows both already. A null `ptr` does nothing. An unknown pointer
/// or a double free is reported on stderr (once) and otherwise ignored.
///
/// # Safety
/// 1. `ptr` is null or was returned by `allocview_malloc(_, device, _)` and not freed since.
/// 2. No work that uses the memory is still to run on the device, other than work queued on the
///    allocation's own stream (the caching allocator may hand the block out again at once for
///    that stream, as PyTorch's does).
#[allow(unsafe_code)] // `no_mangle` exports the symbol; see `# Safety`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn allocview_free(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = (size, stream);
    if ptr.is_null() {
        return;
    }
    guarded((), || {
        let Some(rt) = runtime_or_report() else {
            return;
        };
        if let Err(e) = rt.free(ptr as u64, device) {
            FAILURES.report(Failure::Free, &e);
        }
    });
}

/// Returns every whole cached segment of every opened device to the device
/// (`torch.cuda.empty_cache()`; usable as PyTorch's pluggable `reset_fn`).
#[allow(unsafe_code)] // `no_mangle` exports the symbol; the function itself is safe.
#[unsafe(no_mangle)]
pub extern "C" fn allocview_empty_cache() {
    guarded((), || {
        let Some(rt) = runtime_or_report() else {
            return;
        };
        if let Err(e) = rt.empty_cache() {
            FAILURES.report(Failure::EmptyCache, &e);
        }
    });
}

/// `torch.cuda.memory_stats(device)` as a JSON object (`{"allocated_bytes.all.current": ...}`),
/// in a string the caller frees with [`allocview_string_free`]; null on failure (an unknown
/// device, a library that could not start).
#[allow(unsafe_code)] // `no_mangle` exports the symbol; the function itself is safe.
#[unsafe(no_mangle)]
pub extern "C" fn allocview_memory_stats_json(device: c_int) -> *mut c_char {
    guarded(ptr::null_mut(), || {
        let Some(rt) = runtime_or_report() else {
            return ptr::null_mut();
        };
        let json = rt
            .memory_stats(device)
            .map_err(|e| e.to_string())
            .and_then(|m| serde_json::to_string(&m).map_err(|e| e.to_string()))
            .and_then(|s| CString::new(s).map_err(|e| e.to_string()));
        match json {
            Ok(s) => s.into_raw(),
            Err(e) => {
                FAILURES.report(Failure::Stats, &e);
                ptr::null_mut()
            }
        }
    })
}

/// Frees a string this library returned. Null does nothing.
///
/// # Safety
/// 1. `s` is null or was returned by [`allocview_memory_stats_json`] and not freed since.
/// 2. Nothing reads `s` after this call.
#[allow(unsafe_code)] // `no_mangle` exports the symbol; see `# Safety`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn allocview_string_free(s: *mut c_char) {
    if s.is_null() {
        return;
    }
    guarded((), || {
        // SAFETY: by the caller's contract (1) `s` came from `CString::into_raw` in this
        // library and is freed once; (2) nobody reads it afterwards.
        drop(unsafe { CString::from_raw(s) });
    });
}

/// Registers (once) an exit hook that removes the agent's unix socket, so a finished run
/// leaves no stale socket for `allocview --attach` to find. (The runtime lives in a static,
/// which Rust never drops, so the agent's own clean-up would not run.)
#[allow(unsafe_code)] // `atexit` is a libc call.
fn remove_socket_at_exit(path: PathBuf) {
    if SOCKET_PATH.set(path).is_ok() {
        // SAFETY: `atexit` only stores the function pointer; `remove_socket` is an
        // `extern "C" fn()` that never unwinds (its body is under `catch_unwind`).
        let status = unsafe { libc::atexit(remove_socket) };
        if status != 0 {
            tracing::warn!(target: "allocview", "atexit failed: the socket will be left behind");
        }
    }
}

extern "C" fn remove_socket() {
    let _ = catch_unwind(|| {
        if let Some(p) = SOCKET_PATH.get() {
            let _ = std::fs::remove_file(p);
        }
    });
}
