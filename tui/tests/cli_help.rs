//! `allocview --help` and each subcommand's `--help`, through the real binary: every command
//! shows an example of its most common use.

use std::process::Command;

/// The text `allocview ARGS --help` prints (it must succeed).
fn help(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_allocview"))
        .args(args)
        .arg("--help")
        .output()
        .expect("the allocview binary runs");
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every subcommand.
const SUBCOMMANDS: [&str; 7] = [
    "demo",
    "open",
    "summary",
    "replay",
    "export",
    "bench",
    "screenshot",
];

#[test]
fn every_command_shows_an_example_of_itself() {
    for sub in SUBCOMMANDS {
        let text = help(&[sub]);
        assert!(text.contains("Examples:"), "{sub}: {text}");
        assert!(text.contains(&format!("allocview {sub}")), "{sub}: {text}");
    }
    let top = help(&[]);
    assert!(top.contains("Examples:"), "{top}");
    assert!(top.contains("COMMAND --help"), "{top}");
}

#[test]
fn summary_and_open_help_say_they_read_pytorchs_dump_snapshot_files() {
    for sub in ["summary", "open"] {
        let text = help(&[sub]);
        assert!(text.contains("_dump_snapshot"), "{sub}: {text}");
        assert!(text.contains("oom.pickle"), "{sub}: {text}");
    }
    assert!(help(&["open"]).contains("_record_memory_history"));
}

#[test]
fn replay_help_shows_the_config_syntax_with_an_example() {
    let text = help(&["replay"]);
    assert!(
        text.contains("--config <SETTINGS>") && text.contains("--device-memory <SIZE>"),
        "{text}"
    );
    assert!(
        text.contains("allocview replay oom.pickle --config \"expandable_segments:True\""),
        "{text}"
    );
}

#[test]
fn the_main_help_names_the_environment_variables_attach_reads() {
    let text = help(&[]);
    assert!(
        text.contains("ALLOCVIEW_TOKEN") && text.contains("ALLOCVIEW_ADDR"),
        "{text}"
    );
    assert!(text.contains("ALLOCVIEW_DUMP_DIR"), "{text}");
}
