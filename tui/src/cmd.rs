//! One module per subcommand; each exposes `run`.

pub mod attach;
pub mod bench;
pub mod demo;
pub mod export;
pub mod open;
pub mod replay;
pub mod screenshot;
pub mod summary;
