//! `format_memory_summary` against a table worked out for known stats: the layout, units chosen
//! from the "all" row (KiB below 768 MiB, MiB from there), counts with K from 750,000.

use allocview_alloc::caching::stats::{DeviceStats, Stat, StatArray};
use allocview_alloc::caching::summary::{SUMMARY_WIDTH, format_memory_summary};

const MIB: i64 = 1 << 20;

fn stat(v: [i64; 4]) -> Stat {
    Stat {
        current: v[0],
        peak: v[1],
        allocated: v[2],
        freed: v[3],
    }
}

/// `all` is the sum of the two pools, as the allocator keeps it.
fn array(large: [i64; 4], small: [i64; 4]) -> StatArray {
    let all = [0, 1, 2, 3].map(|i| large[i] + small[i]);
    StatArray([stat(all), stat(small), stat(large)])
}

fn known_stats() -> DeviceStats {
    DeviceStats {
        allocated_bytes: array(
            [40 * MIB, 60 * MIB, 3072 * MIB, 3072 * MIB - 40 * MIB],
            [512, 1536, 700 * 1024, 700 * 1024 - 512],
        ),
        active_bytes: array(
            [40 * MIB, 60 * MIB, 3072 * MIB, 3072 * MIB - 40 * MIB],
            [1024, 1536, 700 * 1024, 700 * 1024 - 1024],
        ),
        requested_bytes: array(
            [
                40 * MIB - 100,
                60 * MIB - 100,
                3072 * MIB - 5000,
                3072 * MIB - 40 * MIB - 4900,
            ],
            [500, 1500, 650 * 1024, 650 * 1024 - 500],
        ),
        reserved_bytes: array(
            [60 * MIB, 80 * MIB, 100 * MIB, 40 * MIB],
            [2 * MIB, 2 * MIB, 2 * MIB, 0],
        ),
        inactive_split_bytes: array(
            [20 * MIB, 30 * MIB, 500 * MIB, 480 * MIB],
            [2 * MIB - 1024, 2 * MIB, 3 * MIB, MIB + 1024],
        ),
        allocation: array([3, 10, 800_000, 799_997], [1, 4, 1200, 1199]),
        active: array([3, 10, 800_000, 799_997], [2, 4, 1200, 1198]),
        segment: array([2, 3, 5, 3], [1, 1, 1, 0]),
        inactive_split: array([1, 2, 50, 49], [1, 1, 3, 2]),
        oversize_allocations: stat([1, 2, 3, 2]),
        oversize_segments: stat([0, 1, 1, 1]),
        num_ooms: 2,
        num_alloc_retries: 5,
        ..DeviceStats::default()
    }
}

/// The expected table is what PyTorch's own `memory_summary` code prints for these figures.
#[test]
fn summary_matches_the_table_pytorch_prints_for_the_same_stats() {
    let expected = [
        "|===========================================================================|",
        "|                  PyTorch CUDA memory summary, device ID 1                 |",
        "|---------------------------------------------------------------------------|",
        "|            CUDA OOMs: 2            |        cudaMalloc retries: 5         |",
        "|===========================================================================|",
        "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |",
        "|---------------------------------------------------------------------------|",
        "| Allocated memory      |  40960 KiB |  61441 KiB |   3072 MiB |   3032 MiB |",
        "|       from large pool |  40960 KiB |  61440 KiB |   3072 MiB |   3032 MiB |",
        "|       from small pool |      0 KiB |      1 KiB |      0 MiB |      0 MiB |",
        "|---------------------------------------------------------------------------|",
        "| Active memory         |  40961 KiB |  61441 KiB |   3072 MiB |   3032 MiB |",
        "|       from large pool |  40960 KiB |  61440 KiB |   3072 MiB |   3032 MiB |",
        "|       from small pool |      1 KiB |      1 KiB |      0 MiB |      0 MiB |",
        "|---------------------------------------------------------------------------|",
        "| Requested memory      |  40960 KiB |  61441 KiB |   3072 MiB |   3032 MiB |",
        "|       from large pool |  40959 KiB |  61439 KiB |   3071 MiB |   3031 MiB |",
        "|       from small pool |      0 KiB |      1 KiB |      0 MiB |      0 MiB |",
        "|---------------------------------------------------------------------------|",
        "| GPU reserved memory   |  63488 KiB |  83968 KiB | 104448 KiB |  40960 KiB |",
        "|       from large pool |  61440 KiB |  81920 KiB | 102400 KiB |  40960 KiB |",
        "|       from small pool |   2048 KiB |   2048 KiB |   2048 KiB |      0 KiB |",
        "|---------------------------------------------------------------------------|",
        "| Non-releasable memory |  22527 KiB |  32768 KiB | 515072 KiB | 492545 KiB |",
        "|       from large pool |  20480 KiB |  30720 KiB | 512000 KiB | 491520 KiB |",
        "|       from small pool |   2047 KiB |   2048 KiB |   3072 KiB |   1025 KiB |",
        "|---------------------------------------------------------------------------|",
        "| Allocations           |       4    |      14    |     801 K  |     801 K  |",
        "|       from large pool |       3    |      10    |     800 K  |     799 K  |",
        "|       from small pool |       1    |       4    |       1 K  |       1 K  |",
        "|---------------------------------------------------------------------------|",
        "| Active allocs         |       5    |      14    |     801 K  |     801 K  |",
        "|       from large pool |       3    |      10    |     800 K  |     799 K  |",
        "|       from small pool |       2    |       4    |       1 K  |       1 K  |",
        "|---------------------------------------------------------------------------|",
        "| GPU reserved segments |       3    |       4    |       6    |       3    |",
        "|       from large pool |       2    |       3    |       5    |       3    |",
        "|       from small pool |       1    |       1    |       1    |       0    |",
        "|---------------------------------------------------------------------------|",
        "| Non-releasable allocs |       2    |       3    |      53    |      51    |",
        "|       from large pool |       1    |       2    |      50    |      49    |",
        "|       from small pool |       1    |       1    |       3    |       2    |",
        "|---------------------------------------------------------------------------|",
        "| Oversize allocations  |       1    |       2    |       3    |       2    |",
        "|---------------------------------------------------------------------------|",
        "| Oversize GPU segments |       0    |       1    |       1    |       1    |",
        "|===========================================================================|",
    ];
    let got = format_memory_summary(&known_stats(), 1);
    let got_lines: Vec<&str> = got.lines().collect();
    assert_eq!(got_lines, expected);
    assert!(got.ends_with("|\n"));
}

#[test]
fn every_summary_line_is_75_columns_between_borders() {
    let got = format_memory_summary(&DeviceStats::default(), 0);
    for line in got.lines() {
        assert_eq!(line.chars().count(), SUMMARY_WIDTH + 2, "{line:?}");
        assert!(line.starts_with('|') && line.ends_with('|'));
    }
    assert!(got.contains("CUDA OOMs: 0 "));
    assert!(got.contains("|      0 B   |"));
}

#[test]
fn an_oom_message_for_one_byte_says_byte_not_bytes() {
    use allocview_alloc::caching::OutOfMemory;
    use allocview_alloc::caching::backend::StreamId;
    let oom = |requested| OutOfMemory {
        device: 0,
        stream: StreamId::DEFAULT,
        requested,
        rounded: 512,
        segment_size: 2 << 20,
        device_total: 1 << 20,
        device_free: 0,
        allowed_max: None,
        allocated: 0,
        reserved: 0,
        reserved_unallocated: 0,
        largest_free_block: 0,
        stranded_in_split_segments: 0,
        expandable_segments: false,
        private_pool: None,
        during_capture: false,
    };
    let one = oom(1).to_string();
    assert!(one.contains("(1 byte requested)"), "{one}");
    let two = oom(2).to_string();
    assert!(two.contains("(2 bytes requested)"), "{two}");
}
