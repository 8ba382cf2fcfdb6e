//! The Overview's limit line at 80 columns, where the side panel leaves the memory box 50:
//! it read `limit 16.0 GiB ×1.00`, a figure without a name. The whole device needs no word; a
//! memory fraction that is set is named.

#[path = "support/screen.rs"]
#[allow(dead_code)]
mod screen;
#[path = "support/builders.rs"]
mod support;

use allocview::state::{UiState, View};

fn limit_row(fraction: Option<f64>) -> String {
    let mut state = support::live_state();
    state.source.memory_fraction = fraction;
    let t = screen::view_text(&state, View::Overview, UiState::default(), 80, 24);
    t.lines()
        .find(|l| l.contains(" limit "))
        .unwrap_or_else(|| panic!("{t}"))
        .to_string()
}

#[test]
fn at_80_columns_the_limit_line_names_a_set_fraction_and_shows_no_bare_multiplier() {
    for whole in [None, Some(1.0)] {
        let row = limit_row(whole);
        assert!(!row.contains('×'), "{row}");
        assert!(row.contains(" limit 16.0 GiB · device free "), "{row}");
    }
    let row = limit_row(Some(0.8));
    assert!(
        row.contains(" limit 12.8 GiB (fraction 0.80) · free "),
        "{row}"
    );
}
