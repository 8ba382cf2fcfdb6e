//! Errors of the pickle reader: every one names the byte offset of the opcode it concerns.

use thiserror::Error;

/// A pickle that could not be read, at byte `offset` of the input.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("pickle byte offset {offset}: {kind}")]
pub struct PickleError {
    /// Byte offset of the opcode (or of the end of input) where reading stopped.
    pub offset: usize,
    /// What went wrong.
    pub kind: PickleErrorKind,
}

/// What went wrong while reading a pickle.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PickleErrorKind {
    /// The input does not start with `PROTO` 2 to 5.
    #[error("not a pickle of protocol 2 to 5 (starts with {found})")]
    NotAPickle {
        /// The first bytes, hex.
        found: String,
    },
    /// `PROTO` names a protocol this reader does not know.
    #[error("unsupported pickle protocol {0} (supported: 2 to 5)")]
    UnsupportedProtocol(u8),
    /// An opcode that imports or calls code, or needs state from outside the pickle.
    #[error("opcode {name} (0x{opcode:02x}) is refused: {why}; snapshot files never need it")]
    Refused {
        /// The opcode byte.
        opcode: u8,
        /// Its `pickletools` name.
        name: &'static str,
        /// Why it is refused.
        why: &'static str,
    },
    /// A byte that is no pickle opcode.
    #[error("unknown opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    /// An opcode's argument runs past the end of the input.
    #[error("{name} needs {needed} more bytes but only {left} remain (truncated file?)")]
    Truncated {
        /// The opcode's name.
        name: &'static str,
        /// Bytes the argument needs.
        needed: u64,
        /// Bytes left in the input.
        left: u64,
    },
    /// The input ended before `STOP`.
    #[error("input ended without STOP (truncated file?)")]
    NoStop,
    /// An opcode found the stack too short or of the wrong shape.
    #[error("{name}: {message}")]
    Malformed {
        /// The opcode's name.
        name: &'static str,
        /// What was wrong.
        message: String,
    },
    /// `BINGET`/`LONG_BINGET` of a memo key never stored.
    #[error("{name}: memo key {key} was never stored")]
    MissingMemo {
        /// The opcode's name.
        name: &'static str,
        /// The key.
        key: u32,
    },
    /// A string that is not valid UTF-8.
    #[error("{name}: string is not valid UTF-8")]
    BadUtf8 {
        /// The opcode's name.
        name: &'static str,
    },
    /// The input is larger than the reader's 32-bit tables can index.
    #[error("input of {0} bytes is larger than the 4 GiB this reader supports")]
    TooLarge(u64),
}
