//! Any bytes through `snapshot_file::from_bytes` (both formats); what loads must also
//! summarize and write back. A panic or a hang is a bug.

#![no_main]

use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_agent::summary;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = snapshot_file::from_bytes(data) {
        let _ = summary::summarize(&s).to_string();
        let pickle = snapshot_file::to_bytes(&s, FileFormat::Pickle);
        // What we write must read back to the same model.
        let back = snapshot_file::from_bytes(&pickle).expect("our own pickle reads back");
        assert!(back == s || has_nan(&s), "pickle round trip differs");
    }
});

/// NaN settings values never compare equal, so they cannot round-trip by `==`.
fn has_nan(s: &allocview_alloc::snapshot::Snapshot) -> bool {
    format!("{:?}", (&s.allocator_settings, &s.external_annotations)).contains("NaN")
}
