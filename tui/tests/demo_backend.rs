//! `allocview demo --backend cuda` in a build without the `cuda` feature: a clear error and a
//! non-zero exit, never a panic. (With the feature, `demo_cuda.rs` runs the CUDA backend.)
#![cfg(not(feature = "cuda"))]

use std::process::Command;

#[test]
fn a_build_without_cuda_refuses_the_cuda_backend_with_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(["demo", "--backend", "cuda", "--headless", "--seconds", "1"])
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run allocview");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(
        stderr.contains("built without CUDA support; rebuild with --features cuda"),
        "stderr:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "stderr:\n{stderr}");
    assert!(out.stdout.is_empty());
}
