//! Files that are not snapshots in ways a careless user or an attacker finds: a huge sparse
//! file, an endless stream that is not a snapshot. Each is an error naming the file, read no
//! further than needed: never an abort on a huge allocation, never a read to the stream's end.

use std::io::Write;
use std::path::Path;

use allocview_agent::snapshot_file::{self, MAX_FILE_BYTES, READ_CHUNK, SnapshotFileError};

#[test]
fn a_file_over_the_size_limit_is_refused_by_its_size_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.pickle");
    // Sparse: a terabyte on paper, nothing on disk.
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(1 << 40).unwrap();
    drop(f);
    let err = snapshot_file::load(&path).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("huge.pickle"), "{text}");
    assert!(text.contains(&(1u64 << 40).to_string()), "{text}");
    assert!(text.contains(&MAX_FILE_BYTES.to_string()), "{text}");
    assert!(matches!(err, SnapshotFileError::Io { .. }), "{err:?}");
}

/// Feeds `total` zero bytes into the FIFO at `fifo`; returns how many were taken before the
/// reader hung up.
fn feed_zeros(fifo: &Path, total: usize) -> std::thread::JoinHandle<usize> {
    let fifo = fifo.to_path_buf();
    std::thread::spawn(move || {
        let mut w = std::fs::OpenOptions::new().write(true).open(fifo).unwrap();
        let block = vec![0u8; 64 * 1024];
        let mut written = 0;
        while written < total {
            match w.write(&block) {
                Ok(n) => written += n,
                Err(_) => break,
            }
        }
        written
    })
}

#[test]
fn an_endless_stream_that_is_not_a_snapshot_is_refused_after_its_first_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("zeros");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        println!("skipped: mkfifo is not available");
        return;
    }
    // As `/dev/zero` would, but bounded, so that a reader reading to the end still ends.
    let total = 64 * READ_CHUNK;
    let feeder = feed_zeros(&fifo, total);
    let err = snapshot_file::load(&fifo).unwrap_err();
    let written = feeder.join().unwrap();
    let text = err.to_string();
    assert!(text.contains("not a snapshot file"), "{text}");
    assert!(text.contains("00 00"), "{text}");
    assert!(
        written < total,
        "the reader took all {written} bytes of a stream that was not a snapshot"
    );
}

#[test]
fn a_snapshot_read_through_a_fifo_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("snap");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        println!("skipped: mkfifo is not available");
        return;
    }
    let snap = allocview_alloc::snapshot::Snapshot::default();
    let bytes = snapshot_file::to_bytes(&snap, snapshot_file::FileFormat::Pickle);
    let path = fifo.clone();
    let feeder = std::thread::spawn(move || {
        let mut w = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        w.write_all(&bytes).unwrap();
    });
    let loaded = snapshot_file::load(&fifo).unwrap();
    feeder.join().unwrap();
    assert_eq!(loaded.segments.len(), 0);
}

#[test]
fn saving_over_something_that_is_not_a_regular_file_is_refused_and_leaves_it_alone() {
    use std::os::unix::fs::FileTypeExt as _;
    let dir = tempfile::tempdir().unwrap();
    let snap = allocview_alloc::snapshot::Snapshot::default();
    // A FIFO stands for any special file (a device such as /dev/full, a socket): the
    // atomic rename would replace it with a regular file.
    let fifo = dir.path().join("out.json");
    if std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        let err = snapshot_file::save(&fifo, &snap, snapshot_file::FileFormat::Json).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("not a regular file"), "{text}");
        assert!(
            std::fs::symlink_metadata(&fifo)
                .unwrap()
                .file_type()
                .is_fifo(),
            "the FIFO was replaced"
        );
    } else {
        println!("skipped the FIFO: mkfifo is not available");
    }
    // A folder.
    let sub = dir.path().join("sub.json");
    std::fs::create_dir(&sub).unwrap();
    let err = snapshot_file::save(&sub, &snap, snapshot_file::FileFormat::Json).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    assert!(sub.is_dir());
}

#[test]
fn saving_through_a_symbolic_link_writes_the_file_it_names_and_keeps_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real.json");
    std::fs::write(&real, b"old").unwrap();
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink("real.json", &link).unwrap();
    let snap = allocview_alloc::snapshot::Snapshot::default();
    snapshot_file::save(&link, &snap, snapshot_file::FileFormat::Json).unwrap();
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link was replaced by a file"
    );
    assert_eq!(snapshot_file::load(&real).unwrap(), snap);
}
