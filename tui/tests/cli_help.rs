//! `allocview --help` and each subcommand's `--help`, through the real binary: every command
//! shows an example of its most common use, and every flag the README's command table and
//! docs/json.md name is one the command has.

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

/// The `--flags` in `text` (`--max-peak`, `--once`, ...), and `-o`.
fn flags(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| (w.starts_with("--") && w.len() > 2) || *w == "-o")
        .map(|w| w.trim_end_matches('-').to_string())
        .collect()
}

/// Whether a help text offers `flag` (followed by a space, `=`, `<`, `[` or the line's end).
fn offers(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        help[i + flag.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-'))
    })
}

#[test]
fn every_flag_in_the_readmes_command_table_is_in_that_commands_help() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let rows: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("| `allocview "))
        .collect();
    assert!(rows.len() >= SUBCOMMANDS.len(), "{rows:?}");
    for row in rows {
        // `allocview demo [...]`: demo's help; `allocview --attach [ADDR]`: the main help.
        let sub = row["| `allocview ".len()..]
            .split([' ', '`'])
            .next()
            .unwrap();
        let text = if sub.starts_with("--") {
            help(&[])
        } else {
            help(&[sub])
        };
        for flag in flags(row) {
            // Cargo's, for the build the row mentions.
            if flag == "--features" {
                continue;
            }
            assert!(offers(&text, &flag), "README: {sub} has no {flag}:\n{text}");
        }
    }
}

#[test]
fn every_allocview_flag_docs_json_md_names_is_in_some_help() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/json.md"))
        .expect("docs/json.md");
    let mut all = help(&[]);
    for sub in SUBCOMMANDS {
        all.push_str(&help(&[sub]));
    }
    for flag in flags(&doc) {
        // jq's, in the documented gate.
        if flag == "--argjson" {
            continue;
        }
        assert!(
            offers(&all, &flag),
            "docs/json.md names {flag}, which no help offers"
        );
    }
}
