//! Any bytes through `snapshot_file::from_bytes` (both formats); what loads must also
//! summarize and round-trip through our pickle. A panic or a hang is a bug.

#![no_main]

use allocview_agent::pytorch;
use allocview_agent::snapshot_file::{self, FileFormat};
use allocview_agent::summary;
use allocview_alloc::snapshot::Snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(mut s) = snapshot_file::from_bytes(data) {
        let _ = summary::summarize(&s).to_string();
        let pickle = snapshot_file::to_bytes(&s, FileFormat::Pickle);
        let back = snapshot_file::from_bytes(&pickle).expect("our own pickle reads back");
        // The writer recomputes each segment's sums from its blocks; compare with those.
        for seg in &mut s.segments {
            (seg.allocated_size, seg.active_size, seg.requested_size) =
                pytorch::segment_sums(&seg.blocks);
        }
        assert!(back == s || has_nan(&s), "pickle round trip differs");
    }
});

/// NaN settings values never compare equal, so they cannot round-trip by `==`.
fn has_nan(s: &Snapshot) -> bool {
    format!("{:?}", (&s.allocator_settings, &s.external_annotations)).contains("NaN")
}
