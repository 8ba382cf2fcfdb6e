//! Any bytes through the pickle reader alone.

#![no_main]

use allocview_agent::pickle;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(doc) = pickle::parse(data) {
        let _ = doc.repr(doc.root(), 256);
    }
});
