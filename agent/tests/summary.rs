//! `summarize`: totals checked against independent computations (Python's own `pickle.load`,
//! and a walk over the raw pickle values), fragmentation, OOM facts and the text.

#[path = "support/snapshot_fixtures.rs"]
mod support;

#[path = "support/snapshot_builders.rs"]
mod builders;

use allocview_agent::diagnosis::DiagnosisKind;
use allocview_agent::pickle::{self, PickleDoc, PickleValue};
use allocview_agent::summary::{self, Summary};
use allocview_agent::{pytorch, snapshot_file};
use builders::rich_snapshot;
use serde_json::Value as Json;

/// The totals `summary --json` promises, computed by Python from the file alone.
const PY_TOTALS: &str = r#"
import pickle, json, sys
d = pickle.load(open(sys.argv[1], 'rb'))
segs = d['segments'] if isinstance(d, dict) else d
traces = d.get('device_traces', []) if isinstance(d, dict) else []
blocks = [b for s in segs for b in s['blocks']]
print(json.dumps({
    'total_reserved': sum(s['total_size'] for s in segs),
    'total_allocated': sum(b['size'] for b in blocks if b['state'] == 'active_allocated'),
    'total_active': sum(b['size'] for b in blocks if b['state'] != 'inactive'),
    'total_requested': sum(b['requested_size'] for b in blocks if b['state'] != 'inactive'),
    'segments': len(segs),
    'blocks': len(blocks),
    'largest_free_block': max([b['size'] for b in blocks if b['state'] == 'inactive'], default=0),
    'trace_entries': sum(len(t) for t in traces),
    'ooms': sum(1 for t in traces for e in t if e['action'] == 'oom'),
}))
"#;

const TOTAL_KEYS: [&str; 9] = [
    "total_reserved",
    "total_allocated",
    "total_active",
    "total_requested",
    "segments",
    "blocks",
    "largest_free_block",
    "trace_entries",
    "ooms",
];

fn ours(s: &Summary) -> Json {
    let v = serde_json::to_value(s).unwrap();
    let mut m = serde_json::Map::new();
    for k in TOTAL_KEYS {
        m.insert(k.into(), v[k].clone());
    }
    Json::Object(m)
}

#[test]
fn totals_equal_what_python_computes_from_every_fixture() {
    if !support::python3_available("totals_equal_what_python_computes_from_every_fixture") {
        return;
    }
    for name in support::FIXTURES {
        let Some(path) = support::fixture(name) else {
            return;
        };
        let s = summary::summarize(&snapshot_file::load(&path).unwrap());
        let theirs: Json =
            serde_json::from_str(&support::python3(PY_TOTALS, &[path.to_str().unwrap()])).unwrap();
        assert_eq!(ours(&s), theirs, "{name}");
    }
}

/// The same totals from the raw pickle values, without the model.
fn raw_totals(doc: &PickleDoc<'_>) -> Json {
    let dict = |v: PickleValue| match v {
        PickleValue::Dict(d) => d,
        _ => panic!("dict"),
    };
    let list = |v: PickleValue| match v {
        PickleValue::List(l) => doc.items(l),
        _ => panic!("list"),
    };
    let int = |d, k: &str| doc.int(doc.dict_get(d, k).unwrap()).unwrap() as u64;
    let state = |d| match doc.dict_get(d, "state").unwrap() {
        PickleValue::Str(s) => doc.str(s),
        _ => panic!("str"),
    };
    let root = dict(doc.root());
    let segs = list(doc.dict_get(root, "segments").unwrap());
    let (mut reserved, mut allocated, mut active, mut requested, mut blocks, mut largest) =
        (0, 0, 0, 0, 0, 0);
    for s in segs {
        let s = dict(*s);
        reserved += int(s, "total_size");
        for b in list(doc.dict_get(s, "blocks").unwrap()) {
            let b = dict(*b);
            blocks += 1;
            let size = int(b, "size");
            match state(b) {
                "active_allocated" => allocated += size,
                "inactive" => largest = largest.max(size),
                _ => {}
            }
            if state(b) != "inactive" {
                active += size;
                requested += int(b, "requested_size");
            }
        }
    }
    let mut entries = 0;
    let mut ooms = 0;
    for t in list(doc.dict_get(root, "device_traces").unwrap()) {
        for e in list(*t) {
            entries += 1;
            if state_is(doc, dict(*e), "action", "oom") {
                ooms += 1;
            }
        }
    }
    serde_json::json!({
        "total_reserved": reserved, "total_allocated": allocated, "total_active": active,
        "total_requested": requested, "segments": segs.len(), "blocks": blocks,
        "largest_free_block": largest, "trace_entries": entries, "ooms": ooms,
    })
}

fn state_is(
    doc: &PickleDoc<'_>,
    d: allocview_agent::pickle::ContainerId,
    k: &str,
    want: &str,
) -> bool {
    matches!(doc.dict_get(d, k), Some(PickleValue::Str(s)) if doc.str(s) == want)
}

#[test]
fn totals_equal_a_walk_over_the_raw_pickle_values() {
    for name in support::FIXTURES {
        let Some(bytes) = support::fixture_bytes(name) else {
            return;
        };
        let doc = pickle::parse(&bytes).unwrap();
        let s = summary::summarize(&pytorch::from_pickle(&bytes).unwrap());
        assert_eq!(ours(&s), raw_totals(&doc), "{name}");
    }
}

#[test]
fn each_device_carries_pytorchs_memory_summary_table() {
    let Some(bytes) = support::fixture_bytes("small-97-events.pickle") else {
        return;
    };
    let s = summary::summarize(&pytorch::from_pickle(&bytes).unwrap());
    assert_eq!(s.devices.len(), 1);
    let d = &s.devices[0];
    assert!(
        d.memory_summary
            .contains("PyTorch CUDA memory summary, device ID 0"),
        "{}",
        d.memory_summary
    );
    assert_eq!(
        d.memory_stats["reserved_bytes.all.current"] as u64,
        s.total_reserved
    );
    assert_eq!(d.trace_entries, 97);
    assert_eq!(d.actions["alloc"], 36);
    assert_eq!(d.actions["oom"], 0);
    let text = s.to_string();
    assert!(
        text.contains("By pool") && text.contains("By stream"),
        "{text}"
    );
    assert!(text.contains("alloc 36"), "{text}");
}

#[test]
fn pools_streams_ooms_and_ring_overflow_are_reported() {
    let snap = rich_snapshot();
    let s = summary::summarize(&snap);
    assert_eq!(s.devices.len(), 2);
    let d0 = &s.devices[0];
    // Device 0: one large segment (1 MiB allocated, 512 B free, 4 KiB pending free) and one
    // private-pool segment (2 MiB pending free) on another stream.
    assert_eq!(d0.pools.large.allocated, 1 << 20);
    assert_eq!(d0.pools.large.active, (1 << 20) + 4096);
    assert_eq!(d0.pools.large.free, 512);
    assert_eq!(d0.pools.large.free_in_split_segments, 512);
    assert_eq!(d0.pools.large.rounding_waste, 100);
    assert_eq!(d0.pools.private.segments, 1);
    assert_eq!(d0.pools.private.active, 2 << 20);
    assert_eq!(d0.pools.small.segments, 0);
    assert_eq!(d0.streams.len(), 2);
    assert_eq!(d0.streams[1].stream, 0x5555_0000);
    assert_eq!(d0.trace_overflow, 17);
    assert!(d0.ring_overflowed);
    assert_eq!(d0.total_memory, Some(80 << 30));
    // Device 0's trace holds no OOM entry; the snapshot is an agent's dump of an OOM there, so
    // its record is the OOM.
    let [dumped] = d0.ooms.as_slice() else {
        panic!("{:?}", d0.ooms)
    };
    assert_eq!(dumped.index, None);
    assert_eq!((dumped.requested, dumped.stream), (1_000_000_512, 7));
    // 9 GiB reserved but free, none of it in a block as large as the request.
    let why = dumped
        .diagnosis
        .as_ref()
        .expect("diagnosed from the record");
    assert_eq!(why.kind, DiagnosisKind::Fragmentation);
    // Device 1: an expandable segment (free bytes there are not "in split segments") and an OOM.
    let d1 = &s.devices[1];
    assert_eq!(d1.pools.small.free, 32 << 20);
    assert_eq!(d1.pools.small.free_in_split_segments, 0);
    assert_eq!(d1.ooms.len(), 1);
    assert_eq!(d1.ooms[0].requested, 1 << 33);
    assert_eq!(d1.ooms[0].device_free, 12345);
    assert_eq!(s.ooms, 2);
    assert!(!d1.ring_overflowed);

    let text = s.to_string();
    assert!(text.contains("OOMs: 1"), "{text}");
    assert!(text.contains("  dump "), "{text}");
    assert!(text.contains("from the agent's record"), "{text}");
    assert!(text.contains("first OOM — fragmentation: "), "{text}");
    // The OOM's row names its trace entry from 1, as the dashboard numbers entries.
    let row = format!("#{} ", d1.ooms[0].index.unwrap() + 1);
    assert!(text.contains(&row), "{row} in {text}");
    assert!(text.contains("8.00 GiB"), "{text}");
    assert!(text.contains("17 older entries were lost"), "{text}");
    assert!(text.contains("total memory 80.0 GiB"), "{text}");

    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["devices"][0]["pools"]["private"]["active"], 2 << 20);
    assert_eq!(json["devices"][0]["streams"][1]["stream"], 0x5555_0000);
    assert_eq!(json["devices"][1]["ooms"][0]["device_free"], 12345);
}

#[test]
fn table_columns_are_aligned() {
    let s = summary::summarize(&rich_snapshot());
    let text = s.to_string();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim_start().starts_with("pool "))
        .unwrap();
    let width = lines[start].len();
    for l in &lines[start..start + 4] {
        assert_eq!(l.len(), width, "{l:?}");
    }
}

#[test]
fn an_empty_snapshot_summarizes_to_zeros() {
    let s = summary::summarize(&Default::default());
    assert_eq!((s.segments, s.total_reserved, s.ooms), (0, 0, 0));
    assert!(s.devices.is_empty());
    assert!(s.to_string().starts_with("Snapshot: 0 segments"));
}

#[test]
fn sizes_beyond_pytorchs_counters_get_no_table_instead_of_wrapped_figures() {
    let mut s = rich_snapshot();
    s.segments[0].total_size = u64::MAX - 5;
    let sum = summary::summarize(&s);
    assert_eq!(sum.devices[0].totals.reserved, u64::MAX);
    assert!(
        sum.devices[0].memory_summary.contains("not available"),
        "{}",
        sum.devices[0].memory_summary
    );
    let _ = sum.to_string();
}

/// The cells of the `Allocated memory` row: current, peak, total allocated, total freed.
fn allocated_row(table: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|l| l.contains("Allocated memory"))
        .expect("an Allocated memory row");
    line.split('|')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .skip(1)
        .map(String::from)
        .collect()
}

#[test]
fn peaks_and_totals_come_from_replaying_the_trace_and_agree_with_replay() {
    let Some(bytes) = support::fixture_bytes("cs336-ctx256-forward-mixed.pickle") else {
        return;
    };
    let snap = pytorch::from_pickle(&bytes).unwrap();
    let s = summary::summarize(&snap);
    let d = &s.devices[0];
    let row = allocated_row(&d.memory_summary);
    assert_ne!(row[0], row[1], "peak equals current: {row:?}");
    assert_ne!(
        row[3], "0 B",
        "no frees over a trace with 1414 frees: {row:?}"
    );
    let replayed = allocview_agent::replay::replay(
        &snap,
        &allocview_agent::replay::ReplaySettings::default(),
        &mut |_, _| {},
    )
    .unwrap();
    let summary::StatsWindow::Trace {
        entries,
        peak_allocated,
        peak_reserved,
        ..
    } = d.window
    else {
        panic!("window not known: {:?}", d.window);
    };
    assert_eq!(entries, 6587);
    assert_eq!(peak_allocated, replayed.report.runs[0].peak_allocated);
    assert_eq!(peak_reserved, replayed.report.runs[0].peak_reserved);
    assert_eq!(row[1], format!("{} MiB", peak_allocated >> 20));
    // The JSON states what the table states: peaks and totals over the window, but not the
    // requested bytes' (a trace records block sizes), which are absent rather than 0.
    let stats = &d.memory_stats;
    assert_eq!(
        stats["allocated_bytes.all.peak"] as u64, peak_allocated,
        "{stats:?}"
    );
    assert_eq!(
        stats["reserved_bytes.all.peak"] as u64,
        peak_allocated.max(peak_reserved)
    );
    assert_eq!(
        stats["allocation.all.allocated"] as u64, d.actions["alloc"],
        "one allocation per alloc entry of the window"
    );
    assert_eq!(stats["num_ooms"], d.ooms.len() as i64);
    assert!(stats.contains_key("requested_bytes.all.current"));
    for absent in [
        "requested_bytes.all.peak",
        "num_alloc_retries",
        "num_device_alloc",
    ] {
        assert!(
            !stats.contains_key(absent),
            "{absent} is not known: {stats:?}"
        );
    }
    let text = s.to_string();
    assert!(
        text.contains("cover the trace window (6587 entries"),
        "{text}"
    );
    assert!(
        text.contains(&allocview_alloc::stats::human_bytes(peak_allocated)),
        "{text}"
    );
}

#[test]
fn without_a_trace_peaks_and_totals_are_not_known() {
    let mut snap = rich_snapshot();
    snap.device_traces.clear();
    let s = summary::summarize(&snap);
    let d = &s.devices[0];
    let row = allocated_row(&d.memory_summary);
    assert_eq!(row[1..], ["not known"; 3], "{}", d.memory_summary);
    // The OOM and retry counts are totals too: not 0, which would claim there were none.
    let counters = d
        .memory_summary
        .lines()
        .find(|l| l.contains("CUDA OOMs"))
        .unwrap();
    assert!(
        counters.contains("CUDA OOMs: not known") && counters.contains("retries: not known"),
        "{counters}"
    );
    let widths: std::collections::BTreeSet<usize> = d
        .memory_summary
        .lines()
        .map(|l| l.chars().count())
        .collect();
    assert_eq!(widths.len(), 1, "{}", d.memory_summary);
    assert!(matches!(d.window, summary::StatsWindow::NotKnown { .. }));
    assert!(
        d.memory_stats.keys().all(|k| k.ends_with(".current")),
        "only current figures are known: {:?}",
        d.memory_stats
    );
    assert!(d.memory_stats.contains_key("allocated_bytes.all.current"));
    let text = s.to_string();
    assert!(
        text.contains("Peak Usage, Tot Alloc and Tot Freed are not known"),
        "{text}"
    );
}

#[test]
fn streams_are_named_as_on_the_dashboard_and_oom_times_say_their_origin() {
    let s = summary::summarize(&rich_snapshot());
    let text = s.to_string();
    assert!(text.contains("\n  s0 "), "{text}");
    assert!(text.contains(&format!("s{}", 0x5555_0000u64)), "{text}");
    assert!(!text.contains("(default)"), "{text}");
    assert!(text.contains("time since first OOM"), "{text}");
}

#[test]
fn a_size_that_would_read_1000_of_a_unit_prints_in_the_next_unit() {
    use allocview_alloc::stats::human_bytes;
    assert_eq!(human_bytes((1 << 20) - 1), "1.00 MiB");
    assert_eq!(human_bytes((1 << 30) - 1), "1.00 GiB");
    assert_eq!(human_bytes((1 << 20) - 20 * 1024), "0.98 MiB");
    assert_eq!(human_bytes((1 << 20) - 60 * 1024), "964 KiB");
    assert_eq!(human_bytes(1023), "1023 B");
}

#[test]
fn a_snapshot_without_history_says_none_was_recorded_rather_than_judging_its_ring() {
    let mut snap = rich_snapshot();
    snap.device_traces.clear();
    let text = summary::summarize(&snap).to_string();
    assert!(
        text.contains("Trace: 0 entries (no history was recorded"),
        "{text}"
    );
    assert!(!text.contains("the ring did not overflow"), "{text}");
    // With a trace, the ring is judged as before.
    let text = summary::summarize(&rich_snapshot()).to_string();
    assert!(text.contains("the ring"), "{text}");
}
