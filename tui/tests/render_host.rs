//! Render tests of the host heap: a state with only host data (a Rust service whose global
//! allocator is `Instrumented`) shows the "Host heap" box and its chart in the overview at any
//! size; with a device too, the host box sits between the device panels and the chart.

#[path = "support/builders.rs"]
mod support;

use allocview::state::{State, UiState, View};
use allocview::view;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;

const SIZES: [(u16, u16); 4] = [(0, 0), (1, 1), (80, 24), (200, 60)];

fn text(buf: &Buffer) -> String {
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

fn screen(state: &State, ui: &UiState, w: u16, h: u16) -> Terminal<TestBackend> {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| view::draw(f, state, ui)).unwrap();
    t
}

fn overview(state: &State, w: u16, h: u16) -> String {
    text(screen(state, &UiState::default(), w, h).backend().buffer())
}

#[test]
fn a_host_only_state_renders_every_view_at_every_size_without_panicking() {
    for state in [support::host_only_state(30), support::host_only_state(0)] {
        for view in View::ALL {
            for (w, h) in SIZES {
                let ui = UiState {
                    view,
                    ..UiState::default()
                };
                let mut buf = Buffer::empty(Rect::new(0, 0, w, h));
                view::render(buf.area, &mut buf, &state, &ui);
                let mut buf = Buffer::empty(Rect::new(3, 2, w, h));
                view::render_view(view, buf.area, &mut buf, &state, &ui);
                let _ = screen(&state, &ui, w.max(1), h.max(1));
            }
        }
    }
}

#[test]
fn the_overview_of_a_host_only_state_shows_the_host_heap_and_its_chart() {
    for (w, h) in [(80, 24), (200, 60)] {
        let all = overview(&support::host_only_state(30), w, h);
        for word in [
            "Host heap",
            "in use",
            "48.0 MiB",
            "peak  64.0 MiB",
            "allocations 98,765",
            "frees 97,531",
            "live 1,234",
            "total allocated 3.50 GiB",
            "Host heap over time",
        ] {
            assert!(all.contains(word), "{w}x{h} lacks {word:?}:\n{all}");
        }
        // No empty device panels in place of the host heap.
        for word in ["Memory", "Counters", "fragmentation"] {
            assert!(!all.contains(word), "{w}x{h} shows {word:?}:\n{all}");
        }
    }
}

#[test]
fn without_samples_the_host_heap_has_no_chart() {
    let all = overview(&support::host_only_state(0), 80, 24);
    assert!(all.contains("Host heap"), "{all}");
    assert!(all.contains("allocations 98,765"), "{all}");
    assert!(!all.contains("over time"), "{all}");
    assert!(!all.contains("Over time"), "{all}");
}

#[test]
fn with_a_device_too_the_host_box_joins_the_device_panels_and_chart() {
    let mut state = support::live_state();
    state.host = Some(support::host_heap(30));
    let all = overview(&state, 120, 36);
    for word in [
        "Memory",
        "Counters",
        "Host heap",
        "allocations 98,765",
        "Over time",
    ] {
        assert!(all.contains(word), "lacks {word:?}:\n{all}");
    }
    // The device's chart stays; the host's own chart is for host-only processes.
    assert!(!all.contains("Host heap over time"), "{all}");
}

#[test]
fn host_only_overview_screen() {
    let t = screen(&support::host_only_state(30), &UiState::default(), 100, 30);
    insta::assert_snapshot!(t.backend());
}
