//! The pickle reader against Python's own pickles and the real PyTorch fixtures.

#[path = "support/snapshot_fixtures.rs"]
mod support;

use allocview_agent::pickle::{self, PickleDoc, PickleErrorKind, PickleValue};
use serde_json::{Map, Value as Json};

/// `{'a': [x, x] (x = [1, 2], shared), 'big': 2**64+5, 'neg': -2**40, 'f': 1.5,
/// 't': (1, 's', None, True, False), 's': {1, 2}, 'fs': frozenset([3]), 'b': b'\x00\x01',
/// 'u': 'héllo', 'e': (), 'n': 2**63}` as `pickle.dumps(v, protocol=4)` writes it.
const PY_PROTO4: &[u8] = b"\x80\x04\x95\x91\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x01\x61\x94\x5d\x94\x28\x5d\x94\x28\x4b\x01\x4b\x02\x65\x68\x03\x65\x8c\x03\x62\x69\x67\x94\x8a\x09\x05\x00\x00\x00\x00\x00\x00\x00\x01\x8c\x03\x6e\x65\x67\x94\x8a\x06\x00\x00\x00\x00\x00\xff\x8c\x01\x66\x94\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x8c\x01\x74\x94\x28\x4b\x01\x8c\x01\x73\x94\x4e\x88\x89\x74\x94\x68\x08\x8f\x94\x28\x4b\x01\x4b\x02\x90\x8c\x02\x66\x73\x94\x28\x4b\x03\x91\x94\x8c\x01\x62\x94\x43\x02\x00\x01\x94\x8c\x01\x75\x94\x8c\x06\x68\xc3\xa9\x6c\x6c\x6f\x94\x8c\x01\x65\x94\x29\x8c\x01\x6e\x94\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x75\x2e";

/// The same value as protocol 5 writes it (only the PROTO byte differs).
fn py_proto5() -> Vec<u8> {
    let mut v = PY_PROTO4.to_vec();
    v[1] = 5;
    v
}

/// The same value without the set, frozenset and bytes (protocol 2 pickles those through
/// GLOBAL + REDUCE), as `pickle.dumps(v, protocol=2)` writes it: BINPUT/BINUNICODE, no frames.
const PY_PROTO2: &[u8] = b"\x80\x02\x7d\x71\x00\x28\x58\x01\x00\x00\x00\x61\x71\x01\x5d\x71\x02\x28\x5d\x71\x03\x28\x4b\x01\x4b\x02\x65\x68\x03\x65\x58\x03\x00\x00\x00\x62\x69\x67\x71\x04\x8a\x09\x05\x00\x00\x00\x00\x00\x00\x00\x01\x58\x03\x00\x00\x00\x6e\x65\x67\x71\x05\x8a\x06\x00\x00\x00\x00\x00\xff\x58\x01\x00\x00\x00\x66\x71\x06\x47\x3f\xf8\x00\x00\x00\x00\x00\x00\x58\x01\x00\x00\x00\x74\x71\x07\x28\x4b\x01\x58\x01\x00\x00\x00\x73\x71\x08\x4e\x88\x89\x74\x71\x09\x58\x01\x00\x00\x00\x75\x71\x0a\x58\x06\x00\x00\x00\x68\xc3\xa9\x6c\x6c\x6f\x71\x0b\x58\x01\x00\x00\x00\x65\x71\x0c\x29\x58\x01\x00\x00\x00\x6e\x71\x0d\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00\x75\x2e";

/// `pickle.dumps(os.system, protocol=4)`: STACK_GLOBAL.
const PY_GLOBAL4: &[u8] = b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00\x8c\x05\x70\x6f\x73\x69\x78\x94\x8c\x06\x73\x79\x73\x74\x65\x6d\x94\x93\x94\x2e";
/// `pickle.dumps(os.system, protocol=2)`: GLOBAL.
const PY_GLOBAL2: &[u8] =
    b"\x80\x02\x63\x70\x6f\x73\x69\x78\x0a\x73\x79\x73\x74\x65\x6d\x0a\x71\x00\x2e";

fn get(doc: &PickleDoc<'_>, key: &str) -> PickleValue {
    let PickleValue::Dict(d) = doc.root() else {
        panic!("root is not a dict")
    };
    doc.dict_get(d, key)
        .unwrap_or_else(|| panic!("no key {key}"))
}

fn check_common_values(doc: &PickleDoc<'_>) {
    let PickleValue::List(a) = get(doc, "a") else {
        panic!("a is a list")
    };
    let items = doc.items(a);
    assert_eq!(items.len(), 2);
    // The same list twice: one object, shared through the memo.
    assert_eq!(items[0], items[1]);
    let PickleValue::List(x) = items[0] else {
        panic!("x is a list")
    };
    assert_eq!(doc.items(x), &[PickleValue::Int(1), PickleValue::Int(2)]);
    assert_eq!(doc.int(get(doc, "big")), Some((1i128 << 64) + 5));
    assert_eq!(get(doc, "neg"), PickleValue::Int(-(1i64 << 40)));
    assert_eq!(get(doc, "f"), PickleValue::Float(1.5));
    assert_eq!(doc.int(get(doc, "n")), Some(1i128 << 63));
    let PickleValue::Str(u) = get(doc, "u") else {
        panic!("u is a str")
    };
    assert_eq!(doc.str(u), "héllo");
    let PickleValue::Tuple(t) = get(doc, "t") else {
        panic!("t is a tuple")
    };
    assert_eq!(
        doc.repr(PickleValue::Tuple(t), 100),
        "(1, \"s\", None, True, False)"
    );
    let PickleValue::Tuple(e) = get(doc, "e") else {
        panic!("e is a tuple")
    };
    assert!(doc.items(e).is_empty());
}

#[test]
fn reads_pythons_protocol_4_and_5_with_sets_bytes_and_big_ints() {
    for bytes in [PY_PROTO4.to_vec(), py_proto5()] {
        let doc = pickle::parse(&bytes).expect("parses");
        assert_eq!(doc.protocol(), bytes[1]);
        check_common_values(&doc);
        let PickleValue::Set(s) = get(&doc, "s") else {
            panic!("s is a set")
        };
        assert_eq!(doc.items(s), &[PickleValue::Int(1), PickleValue::Int(2)]);
        assert!(matches!(get(&doc, "fs"), PickleValue::FrozenSet(_)));
        let PickleValue::Bytes(b) = get(&doc, "b") else {
            panic!("b is bytes")
        };
        assert_eq!(doc.bytes(b), b"\x00\x01");
    }
}

#[test]
fn reads_pythons_protocol_2_with_binput_and_no_frames() {
    let doc = pickle::parse(PY_PROTO2).expect("parses");
    assert_eq!(doc.protocol(), 2);
    check_common_values(&doc);
}

#[test]
fn a_global_is_refused_with_the_opcode_and_offset() {
    let e = pickle::parse(PY_GLOBAL4).unwrap_err();
    assert_eq!(e.offset, 28);
    assert!(matches!(
        e.kind,
        PickleErrorKind::Refused {
            name: "STACK_GLOBAL",
            ..
        }
    ));
    let msg = e.to_string();
    assert!(
        msg.contains("STACK_GLOBAL") && msg.contains("offset 28"),
        "{msg}"
    );

    let e = pickle::parse(PY_GLOBAL2).unwrap_err();
    assert_eq!(e.offset, 2);
    assert!(e.to_string().contains("GLOBAL"), "{e}");
}

#[test]
fn every_code_running_opcode_is_refused() {
    use allocview_agent::pickle::opcode as op;
    for code in [
        op::GLOBAL,
        op::STACK_GLOBAL,
        op::REDUCE,
        op::BUILD,
        op::INST,
        op::OBJ,
        op::NEWOBJ,
        op::NEWOBJ_EX,
        op::PERSID,
        op::BINPERSID,
        op::EXT1,
        op::EXT2,
        op::EXT4,
        op::NEXT_BUFFER,
    ] {
        let bytes = [op::PROTO, 4, op::NONE, op::NONE, code, op::STOP];
        let e = pickle::parse(&bytes).unwrap_err();
        assert_eq!(e.offset, 4, "{e}");
        assert!(
            matches!(e.kind, PickleErrorKind::Refused { opcode, .. } if opcode == code),
            "{e}"
        );
    }
}

#[test]
fn huge_length_fields_fail_before_allocating() {
    // BINUNICODE8 / BINBYTES8 / FRAME claiming 2^63 bytes, LONG4 claiming 2 GiB.
    for (code, len) in [
        (0x8du8, &(1u64 << 63).to_le_bytes()[..]),
        (0x8e, &(1u64 << 63).to_le_bytes()[..]),
        (0x95, &u64::MAX.to_le_bytes()[..]),
        (0x8b, &0x7fff_ffffu32.to_le_bytes()[..]),
        (b'X', &u32::MAX.to_le_bytes()[..]),
    ] {
        let mut bytes = vec![0x80, 4, code];
        bytes.extend_from_slice(len);
        bytes.push(b'.');
        let e = pickle::parse(&bytes).unwrap_err();
        assert_eq!(e.offset, 2);
        assert!(matches!(e.kind, PickleErrorKind::Truncated { .. }), "{e}");
    }
}

#[test]
fn malformed_stacks_give_errors_naming_the_offset() {
    let cases: &[(&[u8], &str)] = &[
        (b"\x80\x04.", "stack underflow"),
        (b"\x80\x04e.", "no MARK"),
        (b"\x80\x04N(a.", "stack underflow"),
        (b"\x80\x04K\x01(K\x02e.", "expected a list"),
        (b"\x80\x04}(K\x01u.", "odd number"),
        (b"\x80\x04h\x05.", "never stored"),
        (b"\x80\x04\x8c\x02\xff\xfe.", "UTF-8"),
        (b"\x80\x04\xff.", "unknown opcode"),
        (b"\x80\x04N", "without STOP"),
        (b"\x80\x09N.", "protocol 9"),
        (b"\x80\x04I1\n.", "text opcodes"),
        (b"{\"format\":1}", "not a pickle"),
        (b"", "empty input"),
    ];
    for (bytes, want) in cases {
        let e = pickle::parse(bytes).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(want), "{bytes:?}: {msg}");
        assert!(msg.contains("offset"), "{msg}");
    }
}

#[test]
fn every_prefix_of_the_small_fixtures_is_an_error_not_a_panic() {
    for name in support::SMALL_FIXTURES {
        let Some(bytes) = support::fixture_bytes(name) else {
            return;
        };
        for n in 0..bytes.len() {
            let e = pickle::parse(&bytes[..n]).unwrap_err();
            assert!(e.offset <= n, "{name}[..{n}]: {e}");
        }
    }
}

#[test]
fn memo_keys_stored_out_of_order_are_found() {
    // BINPUT 1, BINPUT 0, then MEMOIZE stores key 2 (the memo holds 2 keys), then get all three.
    let bytes = b"\x80\x04K\x07q\x01K\x08q\x00K\x09\x94(h\x00h\x01h\x02l.";
    let doc = pickle::parse(bytes).expect("parses");
    let PickleValue::List(l) = doc.root() else {
        panic!("list")
    };
    assert_eq!(
        doc.items(l),
        &[
            PickleValue::Int(8),
            PickleValue::Int(7),
            PickleValue::Int(9)
        ]
    );
}

fn to_json(doc: &PickleDoc<'_>, v: PickleValue) -> Json {
    match v {
        PickleValue::None => Json::Null,
        PickleValue::Bool(b) => Json::Bool(b),
        PickleValue::Int(i) => Json::from(i),
        PickleValue::BigInt(_) => {
            let i = doc.int(v).expect("fits");
            Json::from(u64::try_from(i).expect("u64"))
        }
        PickleValue::Float(f) => Json::from(f),
        PickleValue::Str(s) => Json::from(doc.str(s)),
        PickleValue::List(c) | PickleValue::Tuple(c) => {
            Json::Array(doc.items(c).iter().map(|v| to_json(doc, *v)).collect())
        }
        PickleValue::Dict(c) => {
            let mut m = Map::new();
            for (k, v) in doc.dict_entries(c) {
                let PickleValue::Str(k) = k else {
                    panic!("str keys")
                };
                m.insert(doc.str(k).to_string(), to_json(doc, v));
            }
            Json::Object(m)
        }
        other => panic!("unexpected {}", other.described()),
    }
}

#[test]
fn fixtures_decode_to_exactly_what_python_reads() {
    if !support::python3_available("fixtures_decode_to_exactly_what_python_reads") {
        return;
    }
    for name in [
        "tiny-3-segments.pickle",
        "small-97-events.pickle",
        "legacy-2.0-history-format.pickle",
    ] {
        let Some(path) = support::fixture(name) else {
            return;
        };
        let bytes = std::fs::read(&path).unwrap();
        let doc = pickle::parse(&bytes).expect("fixture parses");
        let ours = to_json(&doc, doc.root());
        let theirs: Json = serde_json::from_str(&support::python3(
            "import pickle, json, sys; print(json.dumps(pickle.load(open(sys.argv[1], 'rb'))))",
            &[path.to_str().unwrap()],
        ))
        .unwrap();
        assert!(ours == theirs, "{name}: our decoding differs from python's");
    }
}

#[test]
fn fixtures_share_frame_lists_through_the_memo() {
    for name in support::FIXTURES {
        let Some(bytes) = support::fixture_bytes(name) else {
            return;
        };
        let doc = pickle::parse(&bytes).expect("fixture parses");
        assert_eq!(doc.protocol(), 4, "{name}");
        assert!(matches!(doc.root(), PickleValue::Dict(_)), "{name}");
    }
    // The largest fixture refers to ~600 000 frames, but holds only a few thousand containers:
    // shared objects were not copied.
    let Some(bytes) = support::fixture_bytes("cs336-ctx256-forward-mixed.pickle") else {
        return;
    };
    let doc = pickle::parse(&bytes).unwrap();
    assert!(doc.container_count() < 20_000, "{}", doc.container_count());
}
