//! The pickle writer: protocol 4 with framing, restricted to the opcodes PyTorch's browser viewer
//! (`MemoryViz.js`) decodes: `PROTO`, `FRAME`, `MEMOIZE`, `BINGET`/`LONG_BINGET`, `MARK`,
//! `STOP`, `EMPTY_DICT`/`EMPTY_LIST`/`EMPTY_TUPLE`, `TUPLE1`-`TUPLE3`, `TUPLE`, `APPENDS`,
//! `SETITEMS`, `BININT`/`BININT1`/`BININT2`, `LONG1`, `NONE`, `NEWTRUE`/`NEWFALSE`, `BINFLOAT`,
//! `SHORT_BINUNICODE`/`BINUNICODE`.
//!
//! Integers use the smallest encoding, as CPython's `save_long` does; frames follow CPython's
//! `_Framer` (a new frame once the current one holds [`FRAME_SIZE_TARGET`] bytes, split only
//! between opcodes). The caller drives the writer opcode by opcode and decides what to share:
//! [`PickleWriter::memoize`] stores the object just written, [`PickleWriter::get`] refers back
//! to it.

use super::opcode as op;

/// Target size of one frame, as CPython's pickler (`_Framer._FRAME_SIZE_TARGET`).
pub const FRAME_SIZE_TARGET: usize = 64 * 1024;

/// The protocol the writer writes.
pub const WRITE_PROTOCOL: u8 = 4;

/// Bytes of a `FRAME` header: the opcode and an 8-byte length.
const FRAME_HEADER: usize = 9;

/// Longest string `SHORT_BINUNICODE` can hold.
const SHORT_STR_MAX: usize = u8::MAX as usize;

/// Highest memo index `BINGET` (1-byte key) can name.
const SHORT_MEMO_MAX: u32 = u8::MAX as u32;

/// Writes a protocol 4 pickle opcode by opcode.
#[derive(Debug)]
pub struct PickleWriter {
    out: Vec<u8>,
    frame_start: usize,
    next_memo: u32,
}

impl Default for PickleWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl PickleWriter {
    /// A writer that has written `PROTO 4` and opened the first frame.
    pub fn new() -> Self {
        let mut w = PickleWriter {
            out: Vec::with_capacity(FRAME_SIZE_TARGET),
            frame_start: 0,
            next_memo: 0,
        };
        w.out.extend_from_slice(&[op::PROTO, WRITE_PROTOCOL]);
        w.open_frame();
        w
    }

    fn open_frame(&mut self) {
        self.frame_start = self.out.len();
        self.out.push(op::FRAME);
        self.out.extend_from_slice(&[0u8; 8]);
    }

    fn close_frame(&mut self) {
        let len = (self.out.len() - self.frame_start - FRAME_HEADER) as u64;
        self.out[self.frame_start + 1..self.frame_start + FRAME_HEADER]
            .copy_from_slice(&len.to_le_bytes());
    }

    /// Called after every opcode: starts a new frame once the current one is full.
    #[inline]
    fn end_op(&mut self) {
        if self.out.len() - self.frame_start - FRAME_HEADER >= FRAME_SIZE_TARGET {
            self.close_frame();
            self.open_frame();
        }
    }

    #[inline]
    fn op(&mut self, code: u8) {
        self.out.push(code);
        self.end_op();
    }

    /// `None`.
    pub fn none(&mut self) {
        self.op(op::NONE);
    }

    /// `True` or `False`.
    pub fn bool(&mut self, v: bool) {
        self.op(if v { op::NEWTRUE } else { op::NEWFALSE });
    }

    /// A signed int, in the smallest encoding.
    pub fn int(&mut self, v: i64) {
        if (0..=u8::MAX as i64).contains(&v) {
            self.out.extend_from_slice(&[op::BININT1, v as u8]);
        } else if (0..=u16::MAX as i64).contains(&v) {
            self.out.push(op::BININT2);
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if (i32::MIN as i64..=i32::MAX as i64).contains(&v) {
            self.out.push(op::BININT);
            self.out.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            let bytes = v.to_le_bytes();
            // Minimal two's complement: drop sign-extension bytes while the sign survives.
            let mut n = bytes.len();
            while n > 1 {
                let (last, prev) = (bytes[n - 1], bytes[n - 2]);
                if (last == 0x00 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend_from_slice(&[op::LONG1, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
        self.end_op();
    }

    /// An unsigned int: as [`int`](Self::int) when it fits in `i64`, else `LONG1` with nine
    /// bytes (Python reads it exactly).
    pub fn uint(&mut self, v: u64) {
        match i64::try_from(v) {
            Ok(i) => self.int(i),
            Err(_) => {
                self.out.extend_from_slice(&[op::LONG1, 9]);
                self.out.extend_from_slice(&v.to_le_bytes());
                self.out.push(0);
                self.end_op();
            }
        }
    }

    /// A float (`BINFLOAT`, big-endian).
    pub fn float(&mut self, v: f64) {
        self.out.push(op::BINFLOAT);
        self.out.extend_from_slice(&v.to_be_bytes());
        self.end_op();
    }

    /// A `str`.
    pub fn str(&mut self, s: &str) {
        let b = s.as_bytes();
        if b.len() <= SHORT_STR_MAX {
            self.out
                .extend_from_slice(&[op::SHORT_BINUNICODE, b.len() as u8]);
        } else if let Ok(n) = u32::try_from(b.len()) {
            self.out.push(op::BINUNICODE);
            self.out.extend_from_slice(&n.to_le_bytes());
        } else {
            self.out.push(op::BINUNICODE8);
            self.out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        }
        self.out.extend_from_slice(b);
        self.end_op();
    }

    /// An empty dict (fill it with [`mark`](Self::mark), keys and values, then
    /// [`setitems`](Self::setitems)).
    pub fn empty_dict(&mut self) {
        self.op(op::EMPTY_DICT);
    }

    /// An empty list (fill it with [`mark`](Self::mark), items, then [`appends`](Self::appends)).
    pub fn empty_list(&mut self) {
        self.op(op::EMPTY_LIST);
    }

    /// An empty tuple.
    pub fn empty_tuple(&mut self) {
        self.op(op::EMPTY_TUPLE);
    }

    /// `MARK`.
    pub fn mark(&mut self) {
        self.op(op::MARK);
    }

    /// `SETITEMS`: the key/value pairs since the mark go into the dict below it.
    pub fn setitems(&mut self) {
        self.op(op::SETITEMS);
    }

    /// `APPENDS`: the items since the mark go into the list below it.
    pub fn appends(&mut self) {
        self.op(op::APPENDS);
    }

    /// A tuple of the top `n` items (1 to 3), or of the items since the mark when `n` is
    /// `None`.
    pub fn tuple(&mut self, n: Option<usize>) {
        match n {
            Some(1) => self.op(op::TUPLE1),
            Some(2) => self.op(op::TUPLE2),
            Some(3) => self.op(op::TUPLE3),
            _ => self.op(op::TUPLE),
        }
    }

    /// `MEMOIZE`: stores the object on top of the stack; returns its memo index for
    /// [`get`](Self::get).
    pub fn memoize(&mut self) -> u32 {
        self.op(op::MEMOIZE);
        let i = self.next_memo;
        self.next_memo += 1;
        i
    }

    /// Pushes the memoized object `index` again (`BINGET` or `LONG_BINGET`).
    pub fn get(&mut self, index: u32) {
        if index <= SHORT_MEMO_MAX {
            self.out.extend_from_slice(&[op::BINGET, index as u8]);
        } else {
            self.out.push(op::LONG_BINGET);
            self.out.extend_from_slice(&index.to_le_bytes());
        }
        self.end_op();
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.out.len()
    }

    /// Whether nothing but the header has been written.
    pub fn is_empty(&self) -> bool {
        self.out.len() == self.frame_start + FRAME_HEADER && self.frame_start == 2
    }

    /// Writes `STOP`, closes the last frame and returns the pickle.
    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(op::STOP);
        self.close_frame();
        self.out
    }
}
