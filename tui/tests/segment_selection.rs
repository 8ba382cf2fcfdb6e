//! Live, the segment list is ordered by size and new segments push the rows about. A user who
//! has not picked a segment sees the top row selected and its block in the detail pane; in
//! the demo the selection used to follow the first segment (the smallest, 82 MiB) down to row
//! 28 of 43, so the pane described a segment far from where the user was looking. Once the
//! user picks one, the selection follows it (see app_live.rs).

#[path = "support/builders.rs"]
mod support;

use allocview::app::App;
use allocview::input::Action;
use allocview::state::View;

fn selected_address(app: &App) -> u64 {
    app.state.segments[app.state.selected_segment(&app.ui).unwrap()].address
}

#[test]
fn an_unpicked_selection_stays_on_the_top_row_when_a_bigger_segment_arrives() {
    let (mut app, _) = support::live_app(support::live_states_then_a_bigger_segment());
    app.apply(Action::ShowView(View::Segments)).unwrap();
    app.tick().unwrap();
    assert_eq!(app.ui.segment_row, 0);
    assert_eq!(
        selected_address(&app),
        0x7f00_0000_0000,
        "the new biggest, on top"
    );
}

#[test]
fn a_picked_segment_is_followed_and_a_new_filter_starts_on_top_again() {
    let (mut app, _) = support::live_app(support::live_states_then_a_bigger_segment());
    app.apply(Action::ShowView(View::Segments)).unwrap();
    // Down and up again: the user picked the top row's segment.
    app.apply(Action::Move(1)).unwrap();
    app.apply(Action::Move(-1)).unwrap();
    let picked = selected_address(&app);
    app.tick().unwrap();
    assert_eq!(app.ui.segment_row, 1);
    assert_eq!(selected_address(&app), picked);
    // `f` (another pool's segments) starts the list on its top row.
    app.apply(Action::CycleSegmentFilter).unwrap();
    assert_eq!(app.ui.segment_row, 0);
}
