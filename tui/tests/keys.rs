//! The help overlay against the key map: every key that does something in any view, live or
//! in a file, zoomed or not, is listed in help (so a new binding without a help line fails),
//! and every key help lists is named in the README.

use allocview::input::key;
use allocview::state::ui::HistogramGrouping;
use allocview::state::{UiState, View};
use allocview::view::help::KEYS;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// How help writes a key.
fn label(code: KeyCode) -> String {
    match code {
        KeyCode::Char(' ') => "Space".into(),
        KeyCode::Char(c) => c.to_string(),
        KeyCode::Up => "↑".into(),
        KeyCode::Down => "↓".into(),
        KeyCode::Left => "←".into(),
        KeyCode::Right => "→".into(),
        KeyCode::PageUp => "PgUp".into(),
        KeyCode::PageDown => "PgDn".into(),
        KeyCode::BackTab => "Shift-Tab".into(),
        other => format!("{other:?}"),
    }
}

/// Whether a help key column such as `Tab  Shift-Tab  1-7` names `want`.
fn listed(column: &str, want: &str) -> bool {
    column.split_whitespace().any(|tok| {
        if tok == want {
            return true;
        }
        // `1-7`: a range of single characters.
        let chars: Vec<char> = tok.chars().collect();
        let mut w = want.chars();
        match (chars.as_slice(), w.next(), w.next()) {
            ([a, '-', b], Some(c), None) => (*a..=*b).contains(&c),
            _ => false,
        }
    })
}

fn codes() -> Vec<KeyCode> {
    let mut v: Vec<KeyCode> = (' '..='~').map(KeyCode::Char).collect();
    v.extend([
        KeyCode::Up,
        KeyCode::Down,
        KeyCode::Left,
        KeyCode::Right,
        KeyCode::PageUp,
        KeyCode::PageDown,
        KeyCode::Home,
        KeyCode::End,
        KeyCode::Enter,
        KeyCode::Esc,
        KeyCode::Tab,
        KeyCode::BackTab,
        KeyCode::Backspace,
        KeyCode::Delete,
        KeyCode::Insert,
    ]);
    v.extend((1..=12).map(KeyCode::F));
    v
}

#[test]
fn every_bound_key_is_listed_in_help() {
    let mut missing = Vec::new();
    let mut bound = 0;
    for view in View::ALL {
        for file_mode in [false, true] {
            for zoom in [false, true] {
                for by in [HistogramGrouping::Every, HistogramGrouping::Pool] {
                    let ui = UiState {
                        view,
                        zoom,
                        histogram_by: by,
                        ..UiState::default()
                    };
                    for code in codes() {
                        let k = KeyEvent::new(code, KeyModifiers::NONE);
                        if let Some(action) = key(k, &ui, file_mode) {
                            bound += 1;
                            let l = label(code);
                            if !KEYS.iter().any(|(col, _)| listed(col, &l)) {
                                missing.push(format!("{l} ({action:?} in {view:?})"));
                            }
                        }
                    }
                }
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(bound > 100, "only {bound} bindings found");
    assert!(missing.is_empty(), "bound but not in help: {missing:?}");
    // Ctrl-C quits everywhere and is listed.
    let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
    assert!(key(ctrl_c, &UiState::default(), false).is_some());
    assert!(KEYS.iter().any(|(col, _)| listed(col, "Ctrl-C")));
}

#[test]
fn a_key_missing_from_help_is_caught() {
    // The check itself: `z` is listed, an unbound `x` is not, ranges cover their ends.
    assert!(KEYS.iter().any(|(col, _)| listed(col, "z")));
    assert!(!KEYS.iter().any(|(col, _)| listed(col, "x")));
    assert!(listed("Tab  1-7", "7") && !listed("Tab  1-7", "8"));
}

#[test]
fn every_key_in_help_is_named_in_the_readme() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let mut missing = Vec::new();
    for (column, _) in KEYS {
        for tok in column.split_whitespace() {
            let found = match tok.chars().count() {
                // `q`, `[`, ...; the arrow keys are the README's "arrows" (and ←/→).
                1 if tok.is_ascii() => readme.contains(&format!("`{tok}`")),
                1 => readme.contains("arrows"),
                // `1-7`, which the README writes `1`-`7`.
                3 if tok.as_bytes()[1] == b'-' => {
                    readme.contains(&format!("`{}`-`{}`", &tok[..1], &tok[2..]))
                }
                _ => readme.contains(tok),
            };
            if !found {
                missing.push(tok);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "help lists keys the README does not name: {missing:?}"
    );
}
