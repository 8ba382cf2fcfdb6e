//! Rendering cost: a full frame of the segment view with 10,000 segments into a 200x60
//! `TestBackend`, beside the baseline of an empty frame (header and footer only, no data) in
//! the same run. Goal: under 5 ms per frame. And time travel: a seek in a long trace with
//! checkpoints against a replay from the start.

#[path = "../tests/support/builders.rs"]
mod support;

use allocview::state::{State, UiState, View};
use allocview::view;
use criterion::{Criterion, criterion_group, criterion_main};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

const SEGMENTS: usize = 10_000;
const WIDTH: u16 = 200;
const HEIGHT: u16 = 60;

fn bench(c: &mut Criterion) {
    let many = support::many_segments(SEGMENTS);
    let empty = State::default();
    let ui = UiState {
        view: View::Segments,
        segment_row: SEGMENTS / 2,
        ..UiState::default()
    };
    let mut g = c.benchmark_group("render_200x60");
    let mut t = Terminal::new(TestBackend::new(WIDTH, HEIGHT)).unwrap();
    g.bench_function("baseline_empty_frame", |b| {
        b.iter(|| {
            t.draw(|f| view::draw(f, &empty, &UiState::default()))
                .unwrap();
        })
    });
    let mut t = Terminal::new(TestBackend::new(WIDTH, HEIGHT)).unwrap();
    g.bench_function("segments_view_10000_segments", |b| {
        b.iter(|| {
            t.draw(|f| view::draw(f, &many, &ui)).unwrap();
        })
    });
    let overview = UiState::default();
    let mut t = Terminal::new(TestBackend::new(WIDTH, HEIGHT)).unwrap();
    g.bench_function("overview_10000_segments", |b| {
        b.iter(|| {
            t.draw(|f| view::draw(f, &many, &overview)).unwrap();
        })
    });
    g.finish();
}

/// Seeking in a 95,000-event trace: the checkpointed seek against replaying from the start.
fn time_travel(c: &mut Criterion) {
    let snap = support::traced_snapshot(5_000);
    let src = allocview::source::file::FileSource::new("bench.json", &snap);
    let tt = src.post_mortem().time_travel();
    let mid = tt.len() / 2 + 255;
    let mut g = c.benchmark_group("seek_95000_events");
    g.bench_function("baseline_full_replay", |b| {
        b.iter(|| tt.at_by_full_replay(mid))
    });
    g.bench_function("checkpointed_seek", |b| b.iter(|| tt.at(mid)));
    g.finish();
}

criterion_group!(benches, bench, time_travel);
criterion_main!(benches);
