//! Python's pickle format, both ways, for PyTorch memory snapshots.
//!
//! - [`parse`] reads protocols 2 to 5 into a [`PickleDoc`]: plain data only (dicts, lists,
//!   tuples, sets, ints, floats, strings, bytes, bools, None). Objects the pickle shares through
//!   its memo (`BINGET`/`LONG_BINGET`; PyTorch's snapshots do it tens of thousands of times for
//!   stack frames) stay one object: a memo get copies an index. Everything that imports or calls
//!   code is refused with an error naming the opcode and its byte offset, since a pickle is
//!   untrusted input. See [`reader`] for the limits.
//! - [`PickleWriter`] writes protocol 4 with only the opcodes PyTorch's browser viewer
//!   understands.
//!
//! The opcode semantics follow CPython's `Lib/pickle.py` / `Modules/_pickle.c` and the table in
//! `Lib/pickletools.py`.

pub mod error;
mod intern;
pub mod opcode;
pub mod reader;
pub mod value;
pub mod writer;

pub use error::{PickleError, PickleErrorKind};
pub use reader::{parse, parse_with_progress};
pub use value::{BytesId, Container, ContainerId, PickleDoc, PickleValue, SharedId, StrId};
pub use writer::PickleWriter;
