//! [`Settings`]: which device backend the library runs on and how the caching allocator is
//! configured, read once from the environment ([`Settings::from_env`]).
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `ALLOCVIEW_BACKEND` | `cuda` (real devices) or `sim` (the simulated device) | `cuda` |
//! | `ALLOCVIEW_SIM_MEMORY` | with `sim`: bytes per simulated device (`17179869184`, `64MiB`, `16GiB`) | 16 GiB |
//! | `ALLOCVIEW_SIM_DEVICES` | with `sim`: number of simulated devices | 1 |
//! | `ALLOCVIEW_ALLOC_CONF`, else `PYTORCH_CUDA_ALLOC_CONF` | the caching allocator's settings, PyTorch's syntax | PyTorch's defaults |
//!
//! The default backend is `cuda` even in a build without CUDA support: handing PyTorch
//! pointers of a simulated device would crash the first kernel that touched them, so the
//! simulated device is only ever used when asked for by name.

use allocview_alloc::caching::{AllocatorConfig, ConfigError};

/// Variable naming the backend: `cuda` or `sim`.
pub const BACKEND_ENV: &str = "ALLOCVIEW_BACKEND";
/// Variable giving the capacity of each simulated device.
pub const SIM_MEMORY_ENV: &str = "ALLOCVIEW_SIM_MEMORY";
/// Variable giving the number of simulated devices.
pub const SIM_DEVICES_ENV: &str = "ALLOCVIEW_SIM_DEVICES";

/// Capacity of a simulated device when `ALLOCVIEW_SIM_MEMORY` is not set: 16 GiB, a common
/// training GPU's memory.
pub const DEFAULT_SIM_MEMORY: u64 = 16 << 30;
/// Simulated devices when `ALLOCVIEW_SIM_DEVICES` is not set.
pub const DEFAULT_SIM_DEVICES: i32 = 1;
/// Most simulated devices accepted (more than any machine has GPUs; a typo guard).
pub const MAX_SIM_DEVICES: i32 = 64;

/// Which device backend allocations go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Real CUDA devices (needs the `cuda` feature and an NVIDIA driver).
    Cuda,
    /// Simulated devices of `capacity` bytes each.
    Sim {
        /// Bytes of memory per device.
        capacity: u64,
        /// Number of devices (indices `0..devices`).
        devices: i32,
    },
}

/// A setting that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// `ALLOCVIEW_BACKEND` is neither `cuda` nor `sim`.
    #[error("{BACKEND_ENV}={0:?} is not a backend: expected \"cuda\" or \"sim\"")]
    UnknownBackend(String),
    /// A size or count variable that does not parse.
    #[error("{var}={value:?}: {why}")]
    BadNumber {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// The allocator settings string is malformed.
    #[error("bad allocator settings: {0}")]
    Config(#[from] ConfigError),
}

/// Everything the library reads from its environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The device backend.
    pub backend: BackendKind,
    /// The caching allocator's settings.
    pub config: AllocatorConfig,
}

impl Settings {
    /// Simulated devices with default allocator settings (tests and demos).
    pub fn sim(capacity: u64, devices: i32) -> Settings {
        Settings {
            backend: BackendKind::Sim { capacity, devices },
            config: AllocatorConfig::default(),
        }
    }

    /// Reads the variables in the [module docs](self).
    ///
    /// # Errors
    /// [`SettingsError`] naming the variable and value that are wrong.
    pub fn from_env() -> Result<Settings, SettingsError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`from_env`](Self::from_env), reading variables through `get` (tests), except that
    /// the allocator settings still come from [`AllocatorConfig::from_env`].
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Settings, SettingsError> {
        let backend = match get(BACKEND_ENV).as_deref().map(str::trim) {
            None | Some("") => BackendKind::Cuda,
            Some(b) if b.eq_ignore_ascii_case("cuda") => BackendKind::Cuda,
            Some(b) if b.eq_ignore_ascii_case("sim") => {
                let capacity = match get(SIM_MEMORY_ENV) {
                    Some(v) if !v.trim().is_empty() => parse_bytes(SIM_MEMORY_ENV, &v)?,
                    _ => DEFAULT_SIM_MEMORY,
                };
                let devices = match get(SIM_DEVICES_ENV) {
                    Some(v) if !v.trim().is_empty() => parse_devices(&v)?,
                    _ => DEFAULT_SIM_DEVICES,
                };
                BackendKind::Sim { capacity, devices }
            }
            Some(other) => return Err(SettingsError::UnknownBackend(other.to_string())),
        };
        Ok(Settings {
            backend,
            config: AllocatorConfig::from_env()?,
        })
    }
}

/// A byte count (`17179869184`, `64MiB`, `16GiB`: [`allocview_agent::size::parse_size`]).
fn parse_bytes(var: &'static str, value: &str) -> Result<u64, SettingsError> {
    let bad = |why: &str| SettingsError::BadNumber {
        var,
        value: value.to_string(),
        why: why.to_string(),
    };
    let bytes = allocview_agent::size::parse_size(value).map_err(|e| bad(&e.to_string()))?;
    if bytes == 0 {
        return Err(bad("a device needs some memory"));
    }
    Ok(bytes)
}

fn parse_devices(value: &str) -> Result<i32, SettingsError> {
    match value.trim().parse::<i32>() {
        Ok(n) if (1..=MAX_SIM_DEVICES).contains(&n) => Ok(n),
        _ => Err(SettingsError::BadNumber {
            var: SIM_DEVICES_ENV,
            value: value.to_string(),
            why: format!("expected a device count from 1 to {MAX_SIM_DEVICES}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_default_backend_is_cuda_never_the_simulator() {
        let s = Settings::from_lookup(lookup(&[])).unwrap();
        assert_eq!(s.backend, BackendKind::Cuda);
    }

    #[test]
    fn sim_reads_capacity_with_units_and_device_count() {
        let s = Settings::from_lookup(lookup(&[
            (BACKEND_ENV, "sim"),
            (SIM_MEMORY_ENV, "64MiB"),
            (SIM_DEVICES_ENV, "2"),
        ]))
        .unwrap();
        assert_eq!(
            s.backend,
            BackendKind::Sim {
                capacity: 64 << 20,
                devices: 2
            }
        );
        for (text, bytes) in [
            ("1048576", 1u64 << 20),
            ("16G", 16 << 30),
            ("3kib", 3 << 10),
            ("3kb", 3000),
            (" 2 GiB ", 2 << 30),
        ] {
            assert_eq!(parse_bytes(SIM_MEMORY_ENV, text).unwrap(), bytes, "{text}");
        }
    }

    #[test]
    fn sim_defaults_to_sixteen_gib_on_one_device() {
        let s = Settings::from_lookup(lookup(&[(BACKEND_ENV, "SIM")])).unwrap();
        assert_eq!(
            s.backend,
            BackendKind::Sim {
                capacity: DEFAULT_SIM_MEMORY,
                devices: 1
            }
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = Settings::from_lookup(lookup(&[(BACKEND_ENV, "rocm")])).unwrap_err();
        assert!(e.to_string().contains("ALLOCVIEW_BACKEND=\"rocm\""), "{e}");
        for bad in ["lots", "0", "99999999999T", "-5"] {
            let e = Settings::from_lookup(lookup(&[(BACKEND_ENV, "sim"), (SIM_MEMORY_ENV, bad)]))
                .unwrap_err();
            assert!(e.to_string().starts_with("ALLOCVIEW_SIM_MEMORY="), "{e}");
        }
        let e = Settings::from_lookup(lookup(&[(BACKEND_ENV, "sim"), (SIM_DEVICES_ENV, "0")]))
            .unwrap_err();
        assert!(e.to_string().contains("ALLOCVIEW_SIM_DEVICES"), "{e}");
    }
}
