//! Counting CUDA devices without opening one (feature `cuda`): `cuInit` and
//! `cuDeviceGetCount` through cudarc, after checking that `libcuda` loads at all (cudarc panics
//! on the first call otherwise). Opening a device creates a context on it, which costs memory
//! on that GPU, so the runtime counts first and opens each device only when it is used.

/// The number of CUDA devices the driver sees.
///
/// # Errors
/// Why there is no driver, or the driver's error from `cuInit` / `cuDeviceGetCount`.
pub(crate) fn count() -> Result<i32, String> {
    // SAFETY: `is_culib_present` only tries to open the library with libloading; opening
    // libcuda runs its initialisers, which is what every CUDA program does.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(
            "libcuda.so could not be loaded (no NVIDIA driver installed, or it is not on \
                    the loader path: check LD_LIBRARY_PATH)"
                .into(),
        );
    }
    cudarc::driver::result::init().map_err(|e| format!("cuInit failed: {e:?}"))?;
    cudarc::driver::result::device::get_count()
        .map_err(|e| format!("cuDeviceGetCount failed: {e:?}"))
}
