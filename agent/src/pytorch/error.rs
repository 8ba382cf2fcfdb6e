//! Errors of reading a PyTorch snapshot: the pickle layer's, or a value of the wrong shape,
//! named by its path in the snapshot (`segments[3].blocks[7]`) and the key.

use thiserror::Error;

use crate::pickle::PickleError;

/// A PyTorch snapshot that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PytorchError {
    /// The bytes are not a pickle this reader accepts.
    #[error(transparent)]
    Pickle(#[from] PickleError),
    /// The pickle is fine, but a value is missing or of the wrong type.
    #[error("{path} (pickle byte offset {offset}): {message}")]
    Shape {
        /// Where in the snapshot: `segments[3].blocks[7]`, `device_traces[0][12]`, ...
        path: String,
        /// Byte offset where the enclosing container starts in the pickle.
        offset: usize,
        /// What is wrong, naming the key: `key 'size' is a str, expected int`.
        message: String,
    },
}
