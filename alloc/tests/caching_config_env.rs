//! `AllocatorConfig::from_env`: ALLOCVIEW_ALLOC_CONF first, then PYTORCH_CUDA_ALLOC_CONF, else
//! the default. One test in its own binary, since it changes the process environment.

// Changing the environment is unsafe in edition 2024.
#![allow(unsafe_code)]

use allocview_alloc::caching::AllocatorConfig;
use allocview_alloc::caching::config::{ENV_VAR, PYTORCH_ENV_VAR};

#[test]
fn from_env_prefers_allocviews_variable_then_pytorchs() {
    // SAFETY: this binary has this one test, so no other thread reads the environment while it
    // changes.
    unsafe {
        std::env::remove_var(ENV_VAR);
        std::env::remove_var(PYTORCH_ENV_VAR);
    }
    assert_eq!(
        AllocatorConfig::from_env().unwrap(),
        AllocatorConfig::default()
    );
    // SAFETY: as above.
    unsafe { std::env::set_var(PYTORCH_ENV_VAR, "max_split_size_mb:64") };
    assert_eq!(
        AllocatorConfig::from_env().unwrap().max_split_size(),
        Some(64 << 20)
    );
    // SAFETY: as above.
    unsafe { std::env::set_var(ENV_VAR, "expandable_segments:True") };
    let c = AllocatorConfig::from_env().unwrap();
    assert!(c.expandable_segments());
    assert_eq!(c.max_split_size(), None);
    // SAFETY: as above.
    unsafe { std::env::set_var(ENV_VAR, "expandable_segments:maybe") };
    let e = AllocatorConfig::from_env().unwrap_err().to_string();
    assert!(e.contains("expandable_segments"), "{e}");
    // A malformed value reads as it does from `parse`: the setting as written, no token
    // numbers.
    for var in [ENV_VAR, PYTORCH_ENV_VAR] {
        // SAFETY: as above.
        unsafe {
            std::env::remove_var(ENV_VAR);
            std::env::set_var(var, "bogus");
        }
        let e = AllocatorConfig::from_env().unwrap_err().to_string();
        assert_eq!(
            e, r#""bogus": expected KEY:VALUE (a ':' after "bogus")"#,
            "{var}"
        );
    }
    // SAFETY: as above.
    unsafe {
        std::env::remove_var(ENV_VAR);
        std::env::remove_var(PYTORCH_ENV_VAR);
    }
}
