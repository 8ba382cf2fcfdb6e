//! allocview's in-process agent: allocators publish events into its sink; it aggregates them,
//! keeps snapshots, reads and writes snapshot files, and serves clients.

#![forbid(unsafe_code)]
