//! Lists that CPython's pickler writes in several batches (`MARK ... APPENDS` per 1000 items,
//! `APPEND` for a list of one item) share their items with every equal list, as lists written
//! by one `APPENDS` do; changing one later (through the memo) leaves the others as they were.
//!
//! The pickles below are built opcode by opcode exactly as CPython's `_pickle.c` writes
//! `pickle.dumps([list(range(n)), list(range(n))], protocol=4)` (framing aside: `FRAME` is
//! optional), so the layout is the one real snapshots have.

use allocview_agent::pickle::{self, ContainerId, PickleDoc, PickleValue};

/// CPython's `BATCHSIZE`: items per `APPENDS`.
const CPYTHON_BATCH: usize = 1000;

const PROTO: u8 = 0x80;
const EMPTY_LIST: u8 = b']';
const MEMOIZE: u8 = 0x94;
const MARK: u8 = b'(';
const APPENDS: u8 = b'e';
const APPEND: u8 = b'a';
const BININT: u8 = b'J';
const BINGET: u8 = b'h';
const STOP: u8 = b'.';

/// A CPython-style pickle writer, one opcode at a time.
struct Ops(Vec<u8>);

impl Ops {
    fn new() -> Ops {
        Ops(vec![PROTO, 4])
    }

    fn int(&mut self, v: i32) {
        self.0.push(BININT);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    /// `list(items)` as `_pickle.c`'s `batch_list_exact`: one item with `APPEND`, else batches
    /// of [`CPYTHON_BATCH`] items, each `MARK ... APPENDS`.
    fn list(&mut self, items: &[i32]) {
        self.0.extend_from_slice(&[EMPTY_LIST, MEMOIZE]);
        if let [one] = items {
            self.int(*one);
            self.0.push(APPEND);
            return;
        }
        for batch in items.chunks(CPYTHON_BATCH) {
            self.0.push(MARK);
            for &v in batch {
                self.int(v);
            }
            self.0.push(APPENDS);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        self.0.push(STOP);
        self.0
    }
}

/// `[list(items), list(items), ...]` (`copies` separate lists), the root list memoized first
/// (memo 0), the inner lists memo 1, 2, ...
fn equal_lists(items: &[i32], copies: usize) -> Ops {
    let mut o = Ops::new();
    o.0.extend_from_slice(&[EMPTY_LIST, MEMOIZE, MARK]);
    for _ in 0..copies {
        o.list(items);
    }
    o.0.push(APPENDS);
    o
}

fn root_lists(doc: &PickleDoc<'_>) -> Vec<ContainerId> {
    let PickleValue::List(root) = doc.root() else {
        panic!("root is {:?}", doc.root())
    };
    doc.items(root)
        .iter()
        .map(|v| match v {
            PickleValue::List(l) => *l,
            other => panic!("{other:?}"),
        })
        .collect()
}

fn ints(n: usize) -> Vec<i32> {
    (0..n as i32).collect()
}

fn as_values(items: &[i32]) -> Vec<PickleValue> {
    items.iter().map(|&v| PickleValue::Int(v.into())).collect()
}

fn assert_all_share_one_run(doc: &PickleDoc<'_>, lists: &[ContainerId], items: &[i32]) {
    let first = lists[0];
    let run = doc
        .shared_items(first)
        .unwrap_or_else(|| panic!("a list of {} items is not shared", items.len()));
    for &l in lists {
        assert_eq!(doc.items(l), as_values(items).as_slice());
        assert_eq!(doc.shared_items(l), Some(run), "list {l:?}");
    }
    for w in lists.windows(2) {
        assert_ne!(w[0], w[1], "separate objects");
    }
}

#[test]
fn lists_written_in_several_appends_batches_share_their_items() {
    // 2500 items: batches of 1000, 1000 and 500.
    let items = ints(2 * CPYTHON_BATCH + CPYTHON_BATCH / 2);
    let bytes = equal_lists(&items, 3).finish();
    let doc = pickle::parse(&bytes).unwrap();
    let lists = root_lists(&doc);
    assert_eq!(lists.len(), 3);
    assert_all_share_one_run(&doc, &lists, &items);
}

#[test]
fn a_list_one_item_over_the_batch_size_is_shared_too() {
    // 1001 items: a batch of 1000, then one of a single item.
    let items = ints(CPYTHON_BATCH + 1);
    let bytes = equal_lists(&items, 2).finish();
    let doc = pickle::parse(&bytes).unwrap();
    assert_all_share_one_run(&doc, &root_lists(&doc), &items);
}

#[test]
fn lists_of_exactly_one_batch_and_of_one_item_are_shared() {
    for n in [CPYTHON_BATCH, 1] {
        let items = ints(n);
        let bytes = equal_lists(&items, 2).finish();
        let doc = pickle::parse(&bytes).unwrap();
        assert_all_share_one_run(&doc, &root_lists(&doc), &items);
    }
}

#[test]
fn appending_later_to_a_batched_list_changes_that_list_only() {
    let items = ints(2 * CPYTHON_BATCH + 7);
    let mut o = equal_lists(&items, 2);
    // root.append(second) after second.append(-1): the second list is memo 2.
    o.0.extend_from_slice(&[BINGET, 2]);
    o.int(-1);
    o.0.push(APPEND);
    o.0.push(APPEND);
    let bytes = o.finish();
    let doc = pickle::parse(&bytes).unwrap();
    let lists = root_lists(&doc);
    let [a, b, c] = lists[..] else {
        panic!("{lists:?}")
    };
    assert_eq!(b, c, "the memo get is the same object");
    assert_eq!(doc.items(a), as_values(&items).as_slice());
    assert!(
        doc.shared_items(a).is_some(),
        "the first list is still shared"
    );
    let mut longer = items.clone();
    longer.push(-1);
    assert_eq!(doc.items(b), as_values(&longer).as_slice());
    assert_eq!(doc.shared_items(b), None, "its own items once changed");
}

#[test]
fn different_batched_lists_stay_different() {
    // Equal first batches, different last items: two runs, each list its own contents.
    let a = ints(CPYTHON_BATCH + 3);
    let mut b = a.clone();
    *b.last_mut().unwrap() = -5;
    let mut o = Ops::new();
    o.0.extend_from_slice(&[EMPTY_LIST, MEMOIZE, MARK]);
    o.list(&a);
    o.list(&b);
    o.list(&a);
    o.0.push(APPENDS);
    let bytes = o.finish();
    let doc = pickle::parse(&bytes).unwrap();
    let lists = root_lists(&doc);
    assert_eq!(doc.items(lists[0]), as_values(&a).as_slice());
    assert_eq!(doc.items(lists[1]), as_values(&b).as_slice());
    assert_eq!(doc.items(lists[2]), as_values(&a).as_slice());
    assert_eq!(doc.shared_items(lists[0]), doc.shared_items(lists[2]));
    assert_ne!(doc.shared_items(lists[0]), doc.shared_items(lists[1]));
}

mod property {
    use super::*;
    use proptest::prelude::*;

    /// Lengths around the batch size, and any up to three batches.
    fn length() -> impl Strategy<Value = usize> {
        prop_oneof![
            Just(0),
            Just(1),
            Just(2),
            Just(CPYTHON_BATCH - 1),
            Just(CPYTHON_BATCH),
            Just(CPYTHON_BATCH + 1),
            0..3 * CPYTHON_BATCH,
        ]
    }

    /// A list: one of three prototypes cut to a length (so that equal lists are common).
    fn list() -> impl Strategy<Value = Vec<i32>> {
        (0..3i32, length()).prop_map(|(proto, n)| (0..n as i32).map(|i| i * (proto + 1)).collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn batched_lists_read_back_exactly_and_equal_untouched_ones_share(
            protos in proptest::collection::vec(list(), 1..3),
            picks in proptest::collection::vec(0..2usize, 1..6),
            touched in proptest::collection::vec(any::<bool>(), 6),
        ) {
            // Copies of one or two lists, so that most pairs are equal.
            let lists: Vec<Vec<i32>> = picks.iter().map(|&p| protos[p % protos.len()].clone()).collect();
            // `[l0, l1, ...]`, then `root.append(li)` after `li.append(-1)` for touched lists
            // (memo: root 0, lists 1, 2, ... in order).
            let mut o = Ops::new();
            o.0.extend_from_slice(&[EMPTY_LIST, MEMOIZE, MARK]);
            for l in &lists {
                o.list(l);
            }
            o.0.push(APPENDS);
            let mut model: Vec<Vec<i32>> = lists.clone();
            for (i, _) in lists.iter().enumerate().filter(|(i, _)| touched[*i]) {
                o.0.extend_from_slice(&[BINGET, (i + 1) as u8]);
                o.int(-1);
                o.0.push(APPEND);
                o.0.push(APPEND);
                model[i].push(-1);
            }
            let bytes = o.finish();
            let doc = pickle::parse(&bytes).unwrap();
            let read = root_lists(&doc);
            for (i, want) in model.iter().enumerate() {
                let want = as_values(want);
                prop_assert_eq!(doc.items(read[i]), want.as_slice(), "list {}", i);
            }
            for (j, &id) in read[lists.len()..].iter().enumerate() {
                let i = (0..lists.len()).filter(|i| touched[*i]).nth(j).unwrap();
                prop_assert_eq!(id, read[i], "the memo get is the same list");
            }
            for a in 0..lists.len() {
                for b in a + 1..lists.len() {
                    if !touched[a] && !touched[b] && !model[a].is_empty() && model[a] == model[b] {
                        prop_assert!(doc.shared_items(read[a]).is_some(), "list {} shared", a);
                        prop_assert_eq!(doc.shared_items(read[a]), doc.shared_items(read[b]));
                    }
                }
            }
        }
    }
}
