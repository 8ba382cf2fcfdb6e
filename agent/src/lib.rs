//! allocview's in-process agent: allocators publish events into its sink; it aggregates them,
//! keeps snapshots, reads and writes snapshot files, and serves clients.

#![forbid(unsafe_code)]

pub use allocview_alloc::addr_map;
pub mod agent;
mod agent_thread;
pub mod aggregator;
pub mod client;
pub mod contexts;
pub mod diagnosis;
pub mod dump;
pub mod histogram;
pub mod mirror;
pub mod pickle;
pub mod prometheus;
pub mod protocol;
pub mod provider;
pub mod pytorch;
pub mod replay;
pub mod server;
pub mod sink;
pub mod size;
pub mod snapshot_file;
pub mod state;
pub mod summary;
pub mod text;
pub mod timeline;
