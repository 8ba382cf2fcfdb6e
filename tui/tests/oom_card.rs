//! The OOM view as the demo's `--scenario oom` shows it in an 80-column terminal: the line
//! "OOM #8: ... — press 7" leads to OOM #8's card (it opened on OOM #1), and a card's long
//! lines (the agent's reason for not writing a dump, the context) wrap inside the box instead
//! of being cut at its border.

#[path = "support/screen.rs"]
#[allow(dead_code)]
mod screen;
#[path = "support/builders.rs"]
mod support;

use allocview::input::Action;
use allocview::state::{OomReport, UiState, View};
use allocview_agent::state::NOT_WRITTEN;

/// The agent's reason for an OOM without a dump (allocview-agent's aggregator).
fn limit_reason() -> String {
    format!("{NOT_WRITTEN}this agent writes at most 4 OOM dumps (AgentBuilder::max_dumps)")
}

#[test]
fn press_7_after_a_new_oom_shows_that_oom() {
    let states = vec![
        support::live_state_with_ooms(1),
        support::live_state_with_ooms(8),
    ];
    let (mut app, _) = support::live_app(states);
    app.tick().unwrap();
    let said = app.state.status.clone().unwrap_or_default();
    assert!(
        said.contains("the last OOM #8: ") && said.contains("press 7"),
        "{said}"
    );
    app.apply(Action::ShowView(View::Oom)).unwrap();
    let t = screen::view_text(&app.state, View::Oom, app.ui.clone(), 80, 24);
    assert!(
        t.contains("┌ OOM #8 "),
        "the card of the OOM the line named:\n{t}"
    );
    assert!(t.contains("8 of 8"), "{t}");
}

#[test]
fn a_user_reading_the_oom_view_keeps_their_place_when_another_oom_comes() {
    let states = vec![
        support::live_state_with_ooms(3),
        support::live_state_with_ooms(4),
    ];
    let (mut app, _) = support::live_app(states);
    app.apply(Action::ShowView(View::Oom)).unwrap();
    app.ui.oom = 1;
    app.tick().unwrap();
    assert_eq!(app.ui.oom, 1);
}

#[test]
fn a_long_dump_reason_and_context_wrap_inside_an_80_column_card() {
    let mut state = support::live_state();
    state.ooms = vec![OomReport {
        dump_path: None,
        dump_pending: false,
        dump_error: Some(limit_reason()),
        ..support::oom()
    }];
    state.ooms_total = 1;
    let t = screen::view_text(&state, View::Oom, UiState::default(), 80, 24);
    // The whole reason is there, over two rows.
    let flat = t
        .lines()
        .map(|l| l.trim_matches('│').trim())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(flat.contains(&format!("dump {}", limit_reason())), "{t}");
}
