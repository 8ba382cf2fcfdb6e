//! `AllocatorConfig`: parsing PyTorch's syntax, its errors, and the rounding rule, with numbers
//! worked out by hand.

use allocview_alloc::caching::CachingAllocator;
use allocview_alloc::caching::config::{
    AllocatorConfig, AllocatorConfigBuilder, ConfigError, LARGE_BUFFER, ROUNDUP_BUCKETS,
    SMALL_BUFFER, VALID_KEYS, roundup_bucket, segment_size,
};
use allocview_alloc::caching::sim::SimBackend;
use allocview_alloc::snapshot::Value;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

#[test]
fn default_rounding_is_to_multiples_of_512_with_a_512_minimum() {
    let c = AllocatorConfig::default();
    assert_eq!(c.round_size(0), 512);
    assert_eq!(c.round_size(1), 512);
    assert_eq!(c.round_size(512), 512);
    assert_eq!(c.round_size(513), 1024);
    assert_eq!(c.round_size(1_200), 1_536);
    assert_eq!(c.round_size(1_300_000), 1_300_480); // 2540 * 512
}

#[test]
fn four_divisions_round_to_quarter_steps_between_powers_of_two() {
    let c = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
    // 1,200 is not above 512 * 4 = 2,048: plain 512 rounding.
    assert_eq!(c.round_size(1_200), 1_536);
    // 1,300,000 lies in [1 MiB, 2 MiB): steps of 256 KiB; next step is 1 MiB + 256 KiB.
    assert_eq!(c.round_size(1_300_000), 1_310_720);
    assert_eq!(c.round_size(1_310_720), 1_310_720);
    // Powers of two stay.
    assert_eq!(c.round_size(4 * MIB), 4 * MIB);
    // 5 MiB + 1 in [4 MiB, 8 MiB): steps of 1 MiB -> 6 MiB.
    assert_eq!(c.round_size(5 * MIB + 1), 6 * MIB);
    // 3,000 in [2 KiB, 4 KiB): steps of 512 -> 3,072.
    assert_eq!(c.round_size(3_000), 3_072);
}

#[test]
fn many_divisions_give_fine_steps_only_above_512_times_d() {
    // 64 divisions: 2,100 is not above 512 * 64 = 32,768, so
    // plain rounding applies; 40,000 in [32 KiB, 64 KiB) gives 512-byte steps.
    let c = AllocatorConfig::parse("roundup_power2_divisions:64").unwrap();
    assert_eq!(c.round_size(2_100), 2_560);
    assert_eq!(c.round_size(40_000), 40_448); // 79 * 512
}

#[test]
fn bucket_index_is_log2_minus_20_clamped() {
    assert_eq!(roundup_bucket(1), 0);
    assert_eq!(roundup_bucket(2 * MIB - 1), 0);
    assert_eq!(roundup_bucket(2 * MIB), 1);
    assert_eq!(roundup_bucket(256 * MIB), 8);
    assert_eq!(roundup_bucket(u64::MAX), ROUNDUP_BUCKETS - 1);
}

#[test]
fn divisions_list_fills_lower_buckets_from_the_first_key_and_greater_from_the_last_named() {
    let c = AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
    let d = c.roundup_power2_divisions();
    // 256 MB is bucket 8; the first key fills buckets 0..8 too.
    assert!(d[..=8].iter().all(|&v| v == 1), "{d:?}");
    assert_eq!(d[9], 2);
    // PyTorch's quirk: '>' fills from the last named bucket (1024 MB = bucket 10) itself.
    assert_eq!(d[10], 8);
    assert!(d[10..].iter().all(|&v| v == 8));
}

#[test]
fn divisions_list_without_greater_leaves_higher_buckets_off() {
    let c = AllocatorConfig::parse("roundup_power2_divisions:[1:4, 4:2]").unwrap();
    let d = c.roundup_power2_divisions();
    assert_eq!(&d[..4], &[4, 0, 2, 0]);
    assert!(d[3..].iter().all(|&v| v == 0));
    // 1.3 MB uses bucket 0 (4 divisions); 4.5 MB bucket 2 (2 divisions: 2 MiB steps -> 6 MiB).
    assert_eq!(c.round_size(1_300_000), 1_310_720);
    assert_eq!(c.round_size(4 * MIB + 512 * KIB), 6 * MIB);
}

#[test]
fn segment_sizes_follow_the_request_class() {
    assert_eq!(segment_size(512), SMALL_BUFFER);
    assert_eq!(segment_size(MIB), SMALL_BUFFER);
    // A 1 MiB + 1 request rounds to 1 MiB + 512 and gets a 20 MiB segment.
    let c = AllocatorConfig::default();
    assert_eq!(segment_size(c.round_size(MIB + 1)), LARGE_BUFFER);
    assert_eq!(segment_size(10 * MIB - 512), LARGE_BUFFER);
    assert_eq!(segment_size(10 * MIB), 10 * MIB);
    assert_eq!(segment_size(10 * MIB + 512), 12 * MIB);
}

#[test]
fn full_config_string_parses_every_setting() {
    let c = AllocatorConfig::parse(
        "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:8],\
         garbage_collection_threshold:0.6,expandable_segments:True,\
         max_non_split_rounding_mb:40, release_lock_on_cudamalloc:False,\
         pinned_use_cuda_host_register:True,pinned_num_register_threads:8,backend:native",
    )
    .unwrap();
    assert_eq!(c.max_split_size(), Some(128 * MIB));
    assert_eq!(c.max_non_split_rounding(), 40 * MIB);
    assert_eq!(c.garbage_collection_threshold(), 0.6);
    assert!(c.expandable_segments());
    assert!(!c.release_lock_on_cudamalloc());
    assert!(c.pinned_use_cuda_host_register());
    assert_eq!(c.pinned_num_register_threads(), 8);
}

#[test]
fn empty_string_is_the_default() {
    assert_eq!(
        AllocatorConfig::parse("").unwrap(),
        AllocatorConfig::default()
    );
    assert_eq!(AllocatorConfig::default().max_split_size(), None);
    assert_eq!(AllocatorConfig::default().max_split_size_or_max(), u64::MAX);
}

fn err(s: &str) -> String {
    AllocatorConfig::parse(s).unwrap_err().to_string()
}

#[test]
fn unknown_key_is_an_error_that_names_it_and_the_valid_keys() {
    let e = AllocatorConfig::parse("max_split_mb:100").unwrap_err();
    assert!(matches!(e, ConfigError::UnknownKey { ref key, .. } if key == "max_split_mb"));
    let m = e.to_string();
    assert!(
        m.contains("max_split_mb") && m.contains("max_split_size_mb"),
        "{m}"
    );
}

#[test]
fn max_split_size_below_20_mb_is_an_error() {
    let m = err("max_split_size_mb:19");
    assert!(
        m.contains("max_split_size_mb") && m.contains("at least 20"),
        "{m}"
    );
    assert!(AllocatorConfig::parse("max_split_size_mb:20").is_ok());
    assert!(err("max_split_size_mb:abc").contains("max_split_size_mb"));
    assert!(err("max_non_split_rounding_mb:10").contains("max_non_split_rounding_mb"));
}

#[test]
fn a_split_size_beyond_every_request_is_an_error_not_a_wrapped_figure() {
    // 9e12 MiB is about 2^63 bytes: it wrapped to a negative `max_split_size` stat.
    for s in [
        "max_split_size_mb:9000000000000",
        "max_split_size_mb:18446744073709551615",
        "max_non_split_rounding_mb:17592186044416",
    ] {
        let m = err(s);
        assert!(m.contains("at most 134217728 (128 TiB)"), "{s}: {m}");
    }
    let c = AllocatorConfig::parse("max_split_size_mb:134217728").unwrap();
    let a = CachingAllocator::new(SimBackend::new(1 << 30), c);
    assert_eq!(a.memory_stats()["max_split_size"], 1 << 47);
    let e = AllocatorConfig::builder()
        .max_split_size_mb(u64::MAX)
        .build()
        .unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("\"{}\" for max_split_size_mb", u64::MAX)),
        "{e}"
    );
    assert!(
        AllocatorConfig::builder()
            .max_non_split_rounding_mb(1 << 60)
            .build()
            .is_err()
    );
}

#[test]
fn the_builder_sets_every_key_the_string_can() {
    let c = AllocatorConfig::builder()
        .max_non_split_rounding_mb(40)
        .release_lock_on_cudamalloc(true)
        .pinned_num_register_threads(8)
        .pinned_use_cuda_host_register(true)
        .pinned_use_background_threads(true)
        .pinned_reserve_segment_size_mb(64)
        .graph_capture_record_stream_reuse(true)
        .build()
        .unwrap();
    let s = "max_non_split_rounding_mb:40,release_lock_on_cudamalloc:True,\
             pinned_num_register_threads:8,pinned_use_cuda_host_register:True,\
             pinned_use_background_threads:True,pinned_reserve_segment_size_mb:64,\
             graph_capture_record_stream_reuse:True";
    assert_eq!(c.source(), s);
    assert_eq!(AllocatorConfig::parse(s).unwrap(), c);
    assert!(c.pinned_use_background_threads());
    assert_eq!(c.pinned_reserve_segment_size_mb(), 64);
    assert!(c.graph_capture_record_stream_reuse());
    // The device-only rendering leaves the host keys out.
    assert_eq!(
        c.to_conf_string(),
        "max_non_split_rounding_mb:40,release_lock_on_cudamalloc:True"
    );
    assert!(
        AllocatorConfig::builder()
            .pinned_num_register_threads(3)
            .build()
            .is_err()
    );
    assert_eq!(
        AllocatorConfigBuilder::default().build().unwrap(),
        AllocatorConfig::default()
    );
}

#[test]
fn threshold_outside_zero_one_is_an_error() {
    for bad in ["0", "1", "1.5", "-0.1", "x"] {
        let m = err(&format!("garbage_collection_threshold:{bad}"));
        assert!(
            m.contains("garbage_collection_threshold") && m.contains("strictly between 0 and 1"),
            "{m}"
        );
    }
}

#[test]
fn bad_bool_is_an_error_naming_true_and_false() {
    let m = err("expandable_segments:yes");
    assert!(
        m.contains("expandable_segments") && m.contains("True or False"),
        "{m}"
    );
    assert!(err("expandable_segments:true").contains("True or False"));
}

#[test]
fn bad_divisions_are_errors_naming_the_valid_forms() {
    for bad in [
        "roundup_power2_divisions:3",
        "roundup_power2_divisions:[256:3]",
        "roundup_power2_divisions:[300:2]",
        "roundup_power2_divisions:[256:2",
        "roundup_power2_divisions:[256]",
    ] {
        let m = err(bad);
        assert!(
            m.contains("roundup_power2_divisions") || m.contains("malformed"),
            "{bad}: {m}"
        );
    }
    assert!(err("roundup_power2_divisions:3").contains("power of two"));
}

#[test]
fn syntax_errors_say_where() {
    let m = err("expandable_segments True");
    assert!(m.contains("a ':' after"), "{m}");
    let m = err("expandable_segments:True max_split_size_mb:30");
    assert!(m.contains("expected ','"), "{m}");
    assert!(err("backend:cudaMallocAsync").contains("native"));
}

#[test]
fn builder_checks_the_same_rules() {
    assert!(
        AllocatorConfig::builder()
            .max_split_size_mb(10)
            .build()
            .is_err()
    );
    assert!(
        AllocatorConfig::builder()
            .garbage_collection_threshold(1.0)
            .build()
            .is_err()
    );
    assert!(
        AllocatorConfig::builder()
            .roundup_power2_divisions(6)
            .build()
            .is_err()
    );
    let c = AllocatorConfig::builder()
        .max_split_size_mb(64)
        .expandable_segments(true)
        .roundup_power2_divisions(4)
        .build()
        .unwrap();
    // The builder's config renders to a string that parses back to the same settings.
    let again = AllocatorConfig::parse(c.source()).unwrap();
    assert_eq!(again, c);
}

#[test]
fn settings_have_pytorchs_keys_in_pytorchs_order() {
    let c = AllocatorConfig::parse("max_split_size_mb:128").unwrap();
    let s = c.to_settings();
    let keys: Vec<&str> = s.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "PYTORCH_CUDA_ALLOC_CONF",
            "max_split_size",
            "garbage_collection_threshold",
            "expandable_segments",
            "pinned_num_register_threads",
            "release_lock_on_cudamalloc",
            "pinned_use_cuda_host_register",
            "roundup_power2_divisions",
        ]
    );
    assert_eq!(s[0].1, Value::Str("max_split_size_mb:128".into()));
    assert_eq!(s[1].1, Value::Int(128 << 20));
    assert_eq!(
        AllocatorConfig::default().to_settings()[1].1,
        Value::Int(-1)
    );
    let Value::Dict(d) = &s[7].1 else {
        panic!("divisions are a dict")
    };
    assert_eq!(d.len(), 16);
    assert_eq!(d[0].0, Value::Str("1".into()));
    assert_eq!(d[15].0, Value::Str("32768".into()));
}

/// What `roundup_power2_divisions` accepts, as every message about it ends.
const DIVISIONS_FORMS: &str = "expected 0 or a power of two, either one value \
(roundup_power2_divisions:4) or a list [256:1,512:2,>:8] whose keys are power-of-two sizes in MB \
or '>'";

/// The end of a message about a malformed `[...]` list item.
const ITEM_FORMS: &str = "is not SIZE_MB:DIVISIONS (e.g. 256:2, or >:8 for every larger size)";

#[test]
fn every_parse_error_names_the_setting_as_written_in_plain_words() {
    let mib = "expected an integer number of MiB, at least 20 and at most 134217728 (128 TiB)";
    let table: Vec<(&str, String)> = vec![
        // No ':' after a name: the whole setting, and what is missing where.
        (
            "bogus",
            r#""bogus": expected KEY:VALUE (a ':' after "bogus")"#.into(),
        ),
        (
            "max_split_size_mb:30,expandable_segments True",
            r#""expandable_segments True": expected KEY:VALUE (a ':' after "expandable_segments")"#
                .into(),
        ),
        // No name before the ':' (or before a list).
        (
            ":5",
            r#"":5": expected KEY:VALUE (a setting name before ":")"#.into(),
        ),
        (
            "[1]",
            r#""[1]": expected KEY:VALUE (a setting name before "[")"#.into(),
        ),
        // Empty settings, by their place.
        (
            ",max_split_size_mb:30",
            "the 1st setting is empty: expected KEY:VALUE between the commas".into(),
        ),
        (
            "max_split_size_mb:30,,expandable_segments:True",
            "the 2nd setting is empty: expected KEY:VALUE between the commas".into(),
        ),
        // A comma forgotten between two settings.
        (
            "expandable_segments:True max_split_size_mb:30",
            r#""expandable_segments:True max_split_size_mb:30": expected ',' after "expandable_segments:True" (one KEY:VALUE per setting)"#
                .into(),
        ),
        (
            "roundup_power2_divisions:[256:1]x",
            r#""roundup_power2_divisions:[256:1]x": expected ',' after "roundup_power2_divisions:[256:1]" (one KEY:VALUE per setting)"#
                .into(),
        ),
        // Unknown key.
        (
            "max_split_mb:100",
            format!(r#"unknown allocator setting "max_split_mb"; valid settings: {VALID_KEYS}"#),
        ),
        // Missing values.
        (
            "max_split_size_mb:",
            format!("max_split_size_mb has no value after ':': {mib}"),
        ),
        (
            "max_split_size_mb:,expandable_segments:True",
            format!("max_split_size_mb has no value after ':': {mib}"),
        ),
        (
            "garbage_collection_threshold:",
            "garbage_collection_threshold has no value after ':': expected a number strictly \
             between 0 and 1"
                .into(),
        ),
        (
            "roundup_power2_divisions:",
            format!("roundup_power2_divisions has no value after ':': {DIVISIONS_FORMS}"),
        ),
        // Bad values and sizes.
        (
            "max_split_size_mb:abc",
            format!(r#"invalid value "abc" for max_split_size_mb: {mib}"#),
        ),
        (
            "max_split_size_mb:-5",
            format!(r#"invalid value "-5" for max_split_size_mb: {mib}"#),
        ),
        (
            "max_split_size_mb:99999999999999999999999",
            format!(r#"invalid value "99999999999999999999999" for max_split_size_mb: {mib}"#),
        ),
        (
            "expandable_segments:yes",
            r#"invalid value "yes" for expandable_segments: expected True or False"#.into(),
        ),
        (
            "expandable_segments:[True]",
            r#"invalid value "[True]" for expandable_segments: expected True or False"#.into(),
        ),
        (
            "backend:cudaMallocAsync",
            r#"invalid value "cudaMallocAsync" for backend: expected native (cudaMallocAsync is not supported by allocview)"#
                .into(),
        ),
        // Out of range.
        (
            "max_split_size_mb:19",
            format!(r#"invalid value "19" for max_split_size_mb: {mib}"#),
        ),
        (
            "max_non_split_rounding_mb:10",
            format!(r#"invalid value "10" for max_non_split_rounding_mb: {mib}"#),
        ),
        (
            "garbage_collection_threshold:1.5",
            r#"invalid value "1.5" for garbage_collection_threshold: expected a number strictly between 0 and 1"#
                .into(),
        ),
        (
            "pinned_num_register_threads:256",
            r#"invalid value "256" for pinned_num_register_threads: expected a power of two no larger than 128"#
                .into(),
        ),
        (
            "pinned_reserve_segment_size_mb:0",
            r#"invalid value "0" for pinned_reserve_segment_size_mb: expected a positive integer"#
                .into(),
        ),
        // roundup_power2_divisions in every form.
        (
            "roundup_power2_divisions:3",
            format!(r#"invalid value "3" for roundup_power2_divisions: {DIVISIONS_FORMS}"#),
        ),
        (
            "roundup_power2_divisions:[256:3]",
            format!(r#"invalid value "256:3" for roundup_power2_divisions: {DIVISIONS_FORMS}"#),
        ),
        (
            "roundup_power2_divisions:[300:2]",
            format!(r#"invalid value "300:2" for roundup_power2_divisions: {DIVISIONS_FORMS}"#),
        ),
        (
            "roundup_power2_divisions:[256:x]",
            format!(r#"invalid value "256:x" for roundup_power2_divisions: {DIVISIONS_FORMS}"#),
        ),
        (
            "roundup_power2_divisions:[256:2",
            r#"roundup_power2_divisions: the list "[256:2" has no closing ']'"#.into(),
        ),
        (
            "roundup_power2_divisions:[256:2,",
            r#"roundup_power2_divisions: the list "[256:2," has no closing ']'"#.into(),
        ),
        (
            "roundup_power2_divisions:[256]",
            format!(r#"roundup_power2_divisions: list item "256" {ITEM_FORMS}"#),
        ),
        (
            "roundup_power2_divisions:[:2]",
            format!(r#"roundup_power2_divisions: list item ":2" {ITEM_FORMS}"#),
        ),
        (
            "roundup_power2_divisions:[256:]",
            format!(r#"roundup_power2_divisions: list item "256:" {ITEM_FORMS}"#),
        ),
        (
            "roundup_power2_divisions:[>]",
            format!(r#"roundup_power2_divisions: list item ">" {ITEM_FORMS}"#),
        ),
        (
            "roundup_power2_divisions:[256:1 512:2]",
            format!(r#"roundup_power2_divisions: list item "256:1 512:2" {ITEM_FORMS}"#),
        ),
        (
            "roundup_power2_divisions:[,256:1]",
            format!("roundup_power2_divisions: list item (empty) {ITEM_FORMS}"),
        ),
    ];
    for (input, expected) in &table {
        let e = AllocatorConfig::parse(input).unwrap_err();
        let m = e.to_string();
        assert_eq!(&m, expected, "{input}");
        // No parser internals: token numbers or "end of string".
        assert!(
            !m.contains("token") && !m.contains("end of string") && !m.contains("malformed"),
            "{input}: {m}"
        );
    }
    // The kinds stay typed.
    assert!(matches!(
        AllocatorConfig::parse("bogus").unwrap_err(),
        ConfigError::MissingColon { ref key, .. } if key == "bogus"
    ));
    assert!(matches!(
        AllocatorConfig::parse("max_split_size_mb:").unwrap_err(),
        ConfigError::MissingValue { ref key, .. } if key == "max_split_size_mb"
    ));
}

#[test]
fn one_trailing_comma_is_accepted_as_pytorch_accepts_it() {
    assert_eq!(
        AllocatorConfig::parse("max_split_size_mb:30,")
            .unwrap()
            .max_split_size(),
        Some(30 << 20)
    );
    assert_eq!(
        AllocatorConfig::parse("roundup_power2_divisions:[256:1,]")
            .unwrap()
            .roundup_power2_divisions(),
        AllocatorConfig::parse("roundup_power2_divisions:[256:1]")
            .unwrap()
            .roundup_power2_divisions()
    );
}
