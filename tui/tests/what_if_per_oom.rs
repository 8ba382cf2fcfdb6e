//! The OOM view's what-if lines speak of each OOM's own request: a trace with two OOMs, the
//! first from fragmentation (expandable segments avoid it), the second a request larger than
//! the device (nothing avoids it), says so on each OOM's card.

use std::sync::Arc;

use allocview::source::file::FileSource;
use allocview::state::from_snapshot::{WhatIfCapacity, oom_entry_of, what_if_lines};
use allocview::units::{GIB, MIB};
use allocview_alloc::caching::backend::StreamId;
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::caching::{AllocatorConfig, CachingAllocator, HistoryOptions};
use allocview_alloc::snapshot::{Snapshot, TraceAction};

/// The first OOM's request: more than any free block of the split segment, and more than the
/// device has left, though the two together would hold it.
const FRAGMENTED: u64 = 200 * MIB;
/// The second OOM's request: more than the whole device.
const TOO_BIG: u64 = 2 * GIB;
/// An allocation after both.
const AFTER: u64 = 20 * MIB;
/// The recordings' device.
const DEVICE: WhatIfCapacity = WhatIfCapacity {
    bytes: GIB,
    device: true,
};

/// Records on a 1 GiB device: a 400 MiB segment split round a live block (190 MiB and 20 MiB
/// free in it), a 500 MiB block beside it, then the two OOMs, the program carrying on after
/// each and allocating [`AFTER`].
fn two_oom_recording() -> Snapshot {
    let alloc = CachingAllocator::new(Arc::new(SimBackend::new(GIB)), AllocatorConfig::default());
    alloc.record_history(HistoryOptions::default());
    let s = StreamId::DEFAULT;
    let whole = alloc.malloc(400 * MIB, s).unwrap();
    alloc.free(whole).unwrap();
    let first = alloc.malloc(190 * MIB, s).unwrap();
    let _middle = alloc.malloc(190 * MIB, s).unwrap();
    alloc.free(first).unwrap();
    let _beside = alloc.malloc(500 * MIB, s).unwrap();
    assert!(alloc.malloc(FRAGMENTED, s).is_err());
    assert!(alloc.malloc(TOO_BIG, s).is_err());
    let _after = alloc.malloc(AFTER, s).unwrap();
    alloc.snapshot()
}

/// The same recording cut at the first OOM, as a dump taken there is.
fn cut_at_first_oom(mut snap: Snapshot) -> Snapshot {
    let trace = &mut snap.device_traces[0];
    let first = trace
        .iter()
        .position(|e| e.action == TraceAction::Oom)
        .unwrap();
    trace.truncate(first + 1);
    snap
}

/// The what-if line of `config` among `lines`.
fn line<'a>(lines: &'a [String], config: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.starts_with(config))
        .unwrap_or_else(|| panic!("no {config} line in {lines:#?}"))
}

#[test]
fn each_oom_card_says_what_the_other_settings_do_to_its_own_request() {
    let snap = two_oom_recording();
    let src = FileSource::new("two-ooms.pickle", &snap);
    let pm = src.post_mortem();
    let state = pm.state_at(pm.len());
    let [fragmented, too_big] = &state.ooms[..] else {
        panic!("two OOMs: {:#?}", state.ooms);
    };
    assert_eq!(
        (fragmented.requested, too_big.requested),
        (FRAGMENTED, TOO_BIG)
    );
    let second_entry = too_big.trace_index.unwrap() + 1;
    let expected = format!(
        "expandable_segments:True   → fits; 1 other OOM, first at entry {second_entry}, peak \
         reserved "
    );
    let got = line(&fragmented.what_if, "expandable_segments:True");
    assert!(got.starts_with(&expected), "{got:?}");
    assert!(
        line(&too_big.what_if, "expandable_segments:True").contains("→ still OOM here"),
        "{:#?}",
        too_big.what_if
    );
    for o in [fragmented, too_big] {
        // The replay at the recorded settings reproduces both: no line says otherwise.
        assert!(
            !o.what_if.iter().any(|l| l.contains("does not reproduce")),
            "{:#?}",
            o.what_if
        );
        // The three cures, the smallest device, then the recorded settings they change.
        assert_eq!(o.what_if.len(), 5, "{:#?}", o.what_if);
        assert!(o.what_if[4].starts_with("(recorded settings: PyTorch defaults;"));
        // The 2 GiB request beside 890 MiB live needs a device of about 2.9 GiB.
        let smallest = line(&o.what_if, "smallest device");
        assert!(
            smallest.contains("→ no OOM in the trace from ~2.9"),
            "{smallest}"
        );
    }
}

#[test]
fn a_dumps_oom_is_found_in_its_trace_by_size_and_time() {
    let snap = two_oom_recording();
    let trace = &snap.device_traces[0];
    let ooms: Vec<usize> = (0..trace.len())
        .filter(|&i| trace[i].action == TraceAction::Oom)
        .collect();
    let time = |i: usize| trace[i].time_us;
    assert_eq!(
        oom_entry_of(&snap, FRAGMENTED, time(ooms[0])),
        Some(ooms[0])
    );
    assert_eq!(oom_entry_of(&snap, TOO_BIG, time(ooms[1])), Some(ooms[1]));
    assert_eq!(oom_entry_of(&snap, TOO_BIG, None), Some(ooms[1]));
    assert_eq!(oom_entry_of(&snap, 3 * MIB, time(ooms[0])), None);
    // Lines for the first OOM, as a live OOM's dump gets them.
    let lines = what_if_lines(&snap, DEVICE, Some(ooms[0]));
    assert!(line(&lines, "expandable_segments:True").contains("→ fits; 1 other OOM"));
    // The first OOM of a trace cut there (a dump taken at it): the replays fit the request,
    // but nothing says what the program would have asked next.
    let cut = cut_at_first_oom(two_oom_recording());
    let lines = what_if_lines(&cut, DEVICE, oom_entry_of(&cut, FRAGMENTED, None));
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("(the trace ends at this request: whether the program's next")),
        "{lines:#?}"
    );
    // With allocations after it, no such caveat.
    let lines = what_if_lines(&snap, DEVICE, Some(ooms[0]));
    assert!(
        !lines.iter().any(|l| l.contains("trace ends")),
        "{lines:#?}"
    );
    // Without an OOM to speak of, the lines count the trace's OOMs.
    let whole = what_if_lines(&snap, DEVICE, None);
    assert!(
        line(&whole, "expandable_segments:True").contains("→ still 1 OOM,"),
        "{whole:#?}"
    );
}

#[test]
fn a_recording_with_expandable_segments_is_not_offered_them_and_its_settings_are_shown() {
    let alloc = CachingAllocator::new(
        Arc::new(SimBackend::new(GIB)),
        AllocatorConfig::parse("expandable_segments:True").unwrap(),
    );
    alloc.record_history(HistoryOptions::default());
    let s = StreamId::DEFAULT;
    let _live = alloc.malloc(800 * MIB, s).unwrap();
    assert!(alloc.malloc(TOO_BIG, s).is_err());
    let snap = alloc.snapshot();
    let oom = oom_entry_of(&snap, TOO_BIG, None);
    let lines = what_if_lines(&snap, DEVICE, oom);
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("expandable_segments:True")),
        "{lines:#?}"
    );
    // The other cures keep expandable segments on: they change one key each.
    assert!(line(&lines, "max_split_size_mb:128").contains("still OOM here"));
    assert_eq!(
        lines.last().map(String::as_str),
        Some(
            "(recorded settings: expandable_segments:True; each what-if changes only the key \
             it names)"
        ),
        "{lines:#?}"
    );
}

#[test]
fn a_file_without_the_device_size_replays_on_what_the_allocator_could_reach() {
    // PyTorch's own files do not record the device's size: the what-ifs run on what the
    // allocator could reach at the first OOM (reserved + device free: the whole 1 GiB here,
    // nobody else used the device), and say so.
    let mut snap = two_oom_recording();
    for d in &mut snap.devices {
        d.total_memory = None;
    }
    let src = FileSource::new("two-ooms.pickle", &snap);
    let pm = src.post_mortem();
    let state = pm.state_at(pm.len());
    let fragmented = &state.ooms[0];
    assert_eq!(fragmented.device_total, None);
    let cure = line(&fragmented.what_if, "expandable_segments:True");
    assert!(
        cure.contains("→ fits; 1 other OOM") && cure.ends_with(" of 1.00 GiB reachable"),
        "{cure}"
    );
    let smallest = line(&fragmented.what_if, "smallest reachable memory");
    assert!(
        smallest.contains("→ no OOM in the trace from ~2.9"),
        "{smallest}"
    );
}

#[test]
fn allocview_open_runs_the_what_ifs_beside_the_dashboard_and_shows_them_when_done() {
    use allocview::source::Source;
    use allocview::state::from_snapshot::{PostMortem, WHAT_IFS_PENDING};
    let snap = two_oom_recording();
    let done = PostMortem::new("two-ooms.pickle", &snap);
    // Before the replays: each OOM says they run; the plan gives what `new` gives.
    let (mut pm, plan) = PostMortem::without_what_ifs("two-ooms.pickle", &snap);
    assert!(
        pm.ooms()
            .iter()
            .all(|o| o.what_if == [WHAT_IFS_PENDING.to_string()])
    );
    pm.set_what_ifs(plan.expect("OOMs in the trace").run(&snap));
    assert_eq!(pm.ooms(), done.ooms());
    // Through the source `allocview open` uses: the lines land in the state by a poll.
    let mut src = FileSource::open("two-ooms.pickle", snap);
    let mut state = allocview::state::State::default();
    assert!(src.poll(&mut state).unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while src.what_ifs_pending() {
        assert!(
            std::time::Instant::now() < deadline,
            "the replays never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
        src.poll(&mut state).unwrap();
    }
    src.poll(&mut state).unwrap();
    assert_eq!(state.ooms, done.ooms());
    // Nothing more to show afterwards.
    assert!(!src.poll(&mut state).unwrap());
}
