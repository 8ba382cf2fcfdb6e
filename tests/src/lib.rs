//! End-to-end tests across allocview's crates live in `tests/tests/`; shared builders here.

#![forbid(unsafe_code)]

pub mod cli;
pub mod fake_libcuda;
pub mod fixtures;
pub mod tmux;
pub mod xorshift;
