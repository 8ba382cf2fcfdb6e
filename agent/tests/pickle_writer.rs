//! The pickle writer: every value kind and integer width, read back by our reader and by
//! Python's `pickle.load`.

#[path = "support/snapshot_fixtures.rs"]
mod support;

use allocview_agent::pickle::{self, PickleValue, PickleWriter};

const INTS: [i64; 15] = [
    0,
    1,
    255,
    256,
    65535,
    65536,
    -1,
    -129,
    i32::MAX as i64,
    i32::MIN as i64,
    1 << 31,
    -(1 << 31) - 1,
    1 << 40,
    i64::MAX,
    i64::MIN,
];

/// `[ints..., u64::MAX, 2**63, 0.5, -0.0, 1e300, '', 'héllo', 'x'*300, None, True, False,
///    (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), {'k': [7]}, <the same dict again>]`
fn sample() -> Vec<u8> {
    let mut w = PickleWriter::new();
    w.empty_list();
    w.mark();
    for i in INTS {
        w.int(i);
    }
    w.uint(u64::MAX);
    w.uint(1 << 63);
    w.float(0.5);
    w.float(-0.0);
    w.float(1e300);
    w.str("");
    w.str("héllo");
    w.str(&"x".repeat(300));
    w.none();
    w.bool(true);
    w.bool(false);
    w.empty_tuple();
    for n in 1..=4 {
        if n == 4 {
            w.mark();
        }
        for i in 1..=n {
            w.int(i);
        }
        w.tuple(if n == 4 { None } else { Some(n as usize) });
    }
    w.empty_dict();
    let d = w.memoize();
    w.mark();
    w.str("k");
    w.empty_list();
    w.mark();
    w.int(7);
    w.appends();
    w.setitems();
    w.get(d);
    w.appends();
    w.finish()
}

const PY_REPR: &str = "[0, 1, 255, 256, 65535, 65536, -1, -129, 2147483647, -2147483648, \
2147483648, -2147483649, 1099511627776, 9223372036854775807, -9223372036854775808, \
18446744073709551615, 9223372036854775808, 0.5, -0.0, 1e+300, '', 'héllo', 'xxx', None, True, \
False, (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), {'k': [7]}, {'k': [7]}] True";

#[test]
fn our_reader_reads_every_value_the_writer_writes() {
    let bytes = sample();
    assert_eq!(&bytes[..3], &[0x80, 4, 0x95], "PROTO 4 then FRAME");
    let doc = pickle::parse(&bytes).expect("parses");
    let PickleValue::List(l) = doc.root() else {
        panic!("list")
    };
    let items = doc.items(l);
    for (i, want) in INTS.iter().enumerate() {
        assert_eq!(items[i], PickleValue::Int(*want));
    }
    assert_eq!(doc.int(items[15]), Some(u64::MAX as i128));
    assert_eq!(doc.int(items[16]), Some(1i128 << 63));
    assert_eq!(items[17], PickleValue::Float(0.5));
    let PickleValue::Str(s) = items[21] else {
        panic!("str")
    };
    assert_eq!(doc.str(s), "héllo");
    // The dict was written once and referred back to: one object.
    assert_eq!(items[31], items[32]);
}

#[test]
fn python_reads_every_value_the_writer_writes() {
    if !support::python3_available("python_reads_every_value_the_writer_writes") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("values.pickle");
    std::fs::write(&p, sample()).unwrap();
    let out = support::python3(
        "import pickle, sys\nv = pickle.load(open(sys.argv[1], 'rb'))\n\
         assert v[22] == 'x' * 300\nv[22] = 'xxx'\nprint(v, v[-1] is v[-2])",
        &[p.to_str().unwrap()],
    );
    assert_eq!(out.trim(), PY_REPR);
}

#[test]
fn large_pickles_are_split_into_frames_between_opcodes() {
    let mut w = PickleWriter::new();
    w.empty_list();
    w.mark();
    for i in 0..100_000 {
        w.int(i);
    }
    w.appends();
    let bytes = w.finish();
    let doc = pickle::parse(&bytes).expect("parses");
    let PickleValue::List(l) = doc.root() else {
        panic!("list")
    };
    assert_eq!(doc.items(l).len(), 100_000);
    if support::python3_available("large_pickles_are_split_into_frames_between_opcodes") {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.pickle");
        std::fs::write(&p, &bytes).unwrap();
        // Python's pure-Python unpickler refuses an opcode that crosses a frame boundary.
        let out = support::python3(
            "import pickle, pickletools, sys\nraw = open(sys.argv[1], 'rb').read()\n\
             frames = [a for op, a, _ in pickletools.genops(raw) if op.name == 'FRAME']\n\
             import io\nassert pickle._Unpickler(io.BytesIO(raw)).load()[-1] == 99999\n\
             print(len(frames) > 1, max(frames) < 70000)",
            &[p.to_str().unwrap()],
        );
        assert_eq!(out.trim(), "True True");
    }
}
