//! The `allocview` command's library: CLI, state model, views, the app loop and the
//! subcommands.

#![forbid(unsafe_code)]

pub mod app;
pub mod cli;
pub mod cmd;
pub mod demo;
pub mod exit;
pub mod input;
pub mod output;
pub mod screenshot;
pub mod source;
pub mod state;
pub mod terminal;
pub mod units;
pub mod view;
