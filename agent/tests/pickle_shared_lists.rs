//! Lists of equal contents written as separate objects (PyTorch writes every traceback as a list
//! of its own) are read once: their items are stored once, the lists stay separate objects,
//! changing one later leaves the others as they were, and a snapshot in that layout with deep
//! stacks decodes to shared frame lists.

use std::sync::Arc;

use allocview_agent::pickle::{self, PickleValue, PickleWriter};
use allocview_agent::pytorch;
use allocview_alloc::snapshot::TraceAction;

/// Lists in the file.
const LISTS: usize = 2_000;

/// `[[1, 'a', 2.5], [1, 'a', 2.5], ...]`, each inner list its own object.
fn equal_lists() -> Vec<u8> {
    let mut w = PickleWriter::new();
    w.empty_list();
    w.mark();
    w.str("a");
    let a = w.memoize();
    w.tuple(Some(1));
    w.appends();
    // `[1, 'a', 2.5]`, its own object.
    let inner = |w: &mut PickleWriter| {
        w.empty_list();
        w.mark();
        w.int(1);
        w.get(a);
        w.float(2.5);
        w.appends();
    };
    w.mark();
    for _ in 0..LISTS {
        inner(&mut w);
    }
    w.appends();
    // Appended one by one, as the root list: another batch.
    w.mark();
    inner(&mut w);
    w.appends();
    w.finish()
}

fn root_items(doc: &pickle::PickleDoc<'_>) -> Vec<PickleValue> {
    match doc.root() {
        PickleValue::List(l) => doc.items(l).to_vec(),
        other => panic!("root is {other:?}"),
    }
}

#[test]
fn equal_lists_stay_separate_objects_and_share_their_items() {
    let bytes = equal_lists();
    let doc = pickle::parse(&bytes).unwrap();
    let items = root_items(&doc);
    assert_eq!(items.len(), LISTS + 2);
    let lists: Vec<_> = items[1..]
        .iter()
        .map(|v| match v {
            PickleValue::List(l) => *l,
            other => panic!("{other:?}"),
        })
        .collect();
    let first = lists[0];
    let shared = doc
        .shared_items(first)
        .expect("a list filled by one APPENDS is shared");
    for &l in &lists[1..] {
        assert_ne!(l, first, "separate objects");
        assert_eq!(doc.items(l), doc.items(first));
        assert_eq!(doc.shared_items(l), Some(shared));
    }
    assert_eq!(doc.items(first).len(), 3);
    assert_eq!(doc.items(first)[2], PickleValue::Float(2.5));
    // The root list (filled by several APPENDS) and the inner lists' one run: a handful, not
    // one per list.
    assert!(doc.shared_count() <= 3, "{}", doc.shared_count());
}

#[test]
fn appending_to_a_list_that_shares_its_items_changes_that_list_only() {
    // `[[7, 8], x, x]` where x is a second `[7, 8]` that gets 9 appended through the memo.
    let mut w = PickleWriter::new();
    w.empty_list();
    w.mark();
    w.empty_list();
    w.mark();
    w.int(7);
    w.int(8);
    w.appends();
    w.empty_list();
    let second = w.memoize();
    w.mark();
    w.int(7);
    w.int(8);
    w.appends();
    w.appends();
    // A third item: the second list again, with 9 appended first.
    w.mark();
    w.get(second);
    w.mark();
    w.int(9);
    w.appends();
    w.appends();
    let bytes = w.finish();
    let doc = pickle::parse(&bytes).unwrap();
    let items = root_items(&doc);
    let [
        PickleValue::List(a),
        PickleValue::List(b),
        PickleValue::List(c),
    ] = items[..]
    else {
        panic!("{items:?}")
    };
    assert_eq!(b, c, "the memo get is the same object");
    assert_eq!(doc.items(a), &[PickleValue::Int(7), PickleValue::Int(8)]);
    assert_eq!(
        doc.items(b),
        &[
            PickleValue::Int(7),
            PickleValue::Int(8),
            PickleValue::Int(9)
        ]
    );
    assert_eq!(doc.shared_items(b), None, "its own items once changed");
}

#[test]
fn lists_that_differ_only_in_the_sign_of_zero_are_not_shared() {
    let mut w = PickleWriter::new();
    w.empty_list();
    w.mark();
    for z in [0.0, -0.0, 0.0] {
        w.empty_list();
        w.mark();
        w.float(z);
        w.appends();
    }
    w.appends();
    let bytes = w.finish();
    let doc = pickle::parse(&bytes).unwrap();
    let items = root_items(&doc);
    let bits: Vec<u64> = items
        .iter()
        .map(|v| match v {
            PickleValue::List(l) => match doc.items(*l) {
                [PickleValue::Float(f)] => f.to_bits(),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        bits,
        [0.0f64.to_bits(), (-0.0f64).to_bits(), 0.0f64.to_bits()]
    );
}

/// Frames per stack, as a `_record_memory_history(stacks="all")` traceback of a training run.
const DEPTH: usize = 48;

/// Trace entries in the file.
const ENTRIES: usize = 3_000;

/// Distinct call sites the entries come from.
const SITES: usize = 7;

/// A snapshot laid out as PyTorch's `_dump_snapshot` writes it: frame dicts written once and
/// referred back to, every trace entry's traceback a list object of its own.
fn pytorch_layout_snapshot() -> Vec<u8> {
    let mut w = PickleWriter::new();
    let key = |w: &mut PickleWriter, k: &str| w.str(k);
    w.empty_dict();
    w.mark();
    key(&mut w, "segments");
    w.empty_list();
    key(&mut w, "device_traces");
    w.empty_list();
    w.mark();
    w.empty_list();
    // Frame dicts: SITES x DEPTH distinct frames, written on first use.
    let mut frame_memo = vec![None; SITES * DEPTH];
    for i in 0..ENTRIES {
        if i % 1000 == 0 {
            if i > 0 {
                w.appends();
            }
            w.mark();
        }
        let site = i % SITES;
        w.empty_dict();
        w.mark();
        key(&mut w, "action");
        key(
            &mut w,
            if i % 2 == 0 {
                "alloc"
            } else {
                "free_requested"
            },
        );
        key(&mut w, "addr");
        w.uint(0x7f00_0000_0000 + (i as u64 / 2) * 512);
        key(&mut w, "size");
        w.uint(512);
        key(&mut w, "stream");
        w.int(0);
        key(&mut w, "time_us");
        w.int(1_700_000_000_000_000 + i as i64);
        key(&mut w, "frames");
        w.empty_list();
        w.mark();
        for d in 0..DEPTH {
            let slot = site * DEPTH + d;
            match frame_memo[slot] {
                Some(m) => w.get(m),
                None => {
                    w.empty_dict();
                    w.mark();
                    key(&mut w, "name");
                    w.str(&format!("fn_{site}_{d}"));
                    key(&mut w, "filename");
                    w.str(&format!("/workspace/model/layer_{d}.py"));
                    key(&mut w, "line");
                    w.int(10 + d as i64);
                    w.setitems();
                    frame_memo[slot] = Some(w.memoize());
                }
            }
        }
        w.appends();
        w.setitems();
    }
    w.appends();
    w.appends();
    w.setitems();
    w.finish()
}

#[test]
fn deep_tracebacks_written_as_separate_lists_decode_to_one_shared_stack_per_site() {
    let bytes = pytorch_layout_snapshot();
    let s = pytorch::from_pickle(&bytes).expect("decodes");
    let trace = &s.device_traces[0];
    assert_eq!(trace.len(), ENTRIES);
    for (i, e) in trace.iter().enumerate() {
        let site = i % SITES;
        assert_eq!(e.frames.len(), DEPTH);
        assert_eq!(e.frames[0].name, format!("fn_{site}_0"));
        assert_eq!(
            e.frames[DEPTH - 1].filename,
            format!("/workspace/model/layer_{}.py", DEPTH - 1)
        );
        assert_eq!(e.frames[DEPTH - 1].line, 10 + DEPTH as i64 - 1);
        let want = if i % 2 == 0 {
            TraceAction::Alloc
        } else {
            TraceAction::FreeRequested
        };
        assert_eq!(e.action, want);
        // One stack per site, shared by every entry of the site.
        assert!(Arc::ptr_eq(&e.frames, &trace[site].frames), "entry {i}");
    }
}

#[test]
fn the_pytorch_layout_writes_each_traceback_anew_and_reads_back_the_same_snapshot() {
    let one = pytorch::from_pickle(&pytorch_layout_snapshot()).expect("decodes");
    let shared = pytorch::to_pickle(&one);
    let per_use = pytorch::to_pickle_pytorch_layout(&one);
    // Every entry's list again (a memo get of each frame dict): much larger.
    assert!(
        per_use.len() > 4 * shared.len(),
        "{} vs {}",
        per_use.len(),
        shared.len()
    );
    let back = pytorch::from_pickle(&per_use).expect("decodes");
    assert_eq!(back, one);
    let trace = &back.device_traces[0];
    assert!(Arc::ptr_eq(&trace[0].frames, &trace[SITES].frames));
    // Each entry has a list object of its own, whose items the reader keeps once.
    let doc = pickle::parse(&per_use).unwrap();
    let lists = (0..doc.container_count())
        .filter(|&c| doc.shared_items(pickle::ContainerId(c as u32)).is_some())
        .count();
    assert!(lists >= ENTRIES, "{lists} lists share their items");
}
