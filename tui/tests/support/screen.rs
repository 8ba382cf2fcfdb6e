//! Drawing states into ratatui's `TestBackend` for render tests: a whole screen, its text, and
//! the "renders at this size without panicking" pass.

use allocview::state::{State, UiState, View};
use allocview::view;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;

/// `state` drawn as a whole `w` x `h` screen through a terminal.
pub fn screen(state: &State, ui: &UiState, w: u16, h: u16) -> Terminal<TestBackend> {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| view::draw(f, state, ui)).unwrap();
    t
}

/// The buffer's symbols, one line a row.
pub fn text(buf: &Buffer) -> String {
    let a = buf.area;
    (a.y..a.y + a.height)
        .map(|y| {
            (a.x..a.x + a.width)
                .map(|x| buf[(x, y)].symbol())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text of `view` of `state` drawn into a `w` x `h` buffer, the rest of `ui` as given.
#[allow(dead_code)] // Not every test that includes this module draws a single view.
pub fn view_text(state: &State, view: View, ui: UiState, w: u16, h: u16) -> String {
    let ui = UiState { view, ..ui };
    let mut buf = Buffer::empty(Rect::new(0, 0, w, h));
    view::render(buf.area, &mut buf, state, &ui);
    text(&buf)
}

/// Renders `ui.view` of `state` at `w` x `h` every way the app does: the whole layout into a
/// buffer, the panel alone at an offset origin, and a full screen through a terminal (the
/// terminal gets at least 1 x 1). Panics only where rendering does.
pub fn render_every_way(state: &State, ui: &UiState, w: u16, h: u16) {
    let mut buf = Buffer::empty(Rect::new(0, 0, w, h));
    view::render(buf.area, &mut buf, state, ui);
    let mut buf = Buffer::empty(Rect::new(3, 2, w, h));
    view::render_view(ui.view, buf.area, &mut buf, state, ui);
    let _ = screen(state, ui, w.max(1), h.max(1));
}

/// `base` in every view, without and with the help overlay.
#[allow(dead_code)] // Not every test that includes this module goes through every view.
pub fn every_view_and_help(base: UiState) -> impl Iterator<Item = UiState> {
    View::ALL.into_iter().flat_map(move |view| {
        let base = base.clone();
        [false, true].map(move |help| UiState {
            view,
            help,
            ..base.clone()
        })
    })
}

/// What `app` draws into `terminal` now, one line a row.
#[allow(dead_code)]
pub fn drawn(app: &mut allocview::app::App, terminal: &mut Terminal<TestBackend>) -> String {
    app.dirty = true;
    app.draw(terminal).unwrap();
    text(terminal.backend().buffer())
}

/// What `app` draws at `w` x `h` now.
#[allow(dead_code)]
pub fn screen_of(app: &mut allocview::app::App, w: u16, h: u16) -> String {
    drawn(app, &mut Terminal::new(TestBackend::new(w, h)).unwrap())
}

/// Presses `code` as the app's loop does: through the key map, then applied.
#[allow(dead_code)]
pub fn press(app: &mut allocview::app::App, code: ratatui::crossterm::event::KeyCode) {
    let key = ratatui::crossterm::event::KeyEvent::from(code);
    if let Some(a) = allocview::input::key(key, &app.ui, app.file_mode()) {
        app.apply(a).unwrap();
    }
}
