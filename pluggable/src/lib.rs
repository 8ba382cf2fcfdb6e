#![doc = include_str!("../README.md")]
// Unsafe code is allowed in this crate, item by item (`#[allow(unsafe_code)]`), for one reason:
// it is a C library. Its entry points must be exported unmangled (`#[unsafe(no_mangle)]`), two of
// them take ownership of raw pointers from C (`allocview_free`, `allocview_string_free`), the exit
// hook is registered with libc's `atexit`, and counting CUDA devices asks cudarc whether libcuda
// loads. Everything else is safe Rust over the allocator and agent crates.

pub mod failure_log;
pub mod ffi;
pub mod runtime;
pub mod settings;

#[cfg(feature = "cuda")]
#[allow(unsafe_code)] // `is_culib_present` is an unsafe fn of cudarc; see the module docs.
mod cuda_devices;
mod device_slot;

pub use runtime::{Runtime, RuntimeError};
pub use settings::{BackendKind, Settings, SettingsError};
