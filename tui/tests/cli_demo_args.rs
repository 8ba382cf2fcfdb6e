//! `allocview demo` and `allocview --attach` arguments through the real binary: the dashboard
//! refuses a stdout that is not a terminal (suggesting `--headless`), options that only mean
//! something with `--headless` require it, `--config` repeats, and the headless OOM scenario
//! reaches its OOMs and reports dumps that could not be written.

use std::process::{Command, Output, Stdio};

/// `allocview ARGS` with stdin closed and stdout/stderr captured (so stdout is a pipe).
fn allocview(args: &[&str]) -> Output {
    allocview_env(args, &[])
}

/// [`allocview`] with extra environment variables.
fn allocview_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .envs(env.iter().copied())
        .env_remove("ALLOCVIEW_ADDR")
        .stdin(Stdio::null())
        .output()
        .expect("allocview runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_dashboard_refuses_a_redirected_stdout_and_suggests_headless() {
    for args in [
        &["demo"][..],
        &["demo", "--scenario", "oom"][..],
        &["--attach", "127.0.0.1:1"][..],
    ] {
        let out = allocview(args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(
            err.contains("stdout is not a terminal") && err.contains("--headless"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("os error"), "{args:?}: {err}");
        assert!(
            out.stdout.is_empty(),
            "{args:?}: nothing is drawn into the redirected stdout"
        );
    }
}
