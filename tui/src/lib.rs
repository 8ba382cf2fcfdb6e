//! The `allocview` command's library: CLI, state model, views, and subcommands.

#![forbid(unsafe_code)]

pub mod cli;
pub mod cmd;
pub mod state;
pub mod units;
pub mod view;
