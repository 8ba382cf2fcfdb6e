//! The pickle reader: a stack machine over protocols 2 to 5, following CPython's
//! `_pickle.c` `load()` loop (stack with a mark fence, memo as a dict keyed by int), restricted to
//! the opcodes that build plain data.
//!
//! Untrusted input is the normal case, so:
//! - opcodes that import, call or build objects (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`,
//!   `INST`, `OBJ`, `NEWOBJ`, `NEWOBJ_EX`, `PERSID`, `BINPERSID`, `EXT1/2/4`, `NEXT_BUFFER`)
//!   are refused with an error naming the opcode and its byte offset;
//! - every length field is checked against the bytes that remain before anything is read, and
//!   strings borrow from the input, so no length field can make the reader allocate;
//! - the reader is a loop, never recursive; the stack, the mark stack and the tables grow at most
//!   one entry per input byte;
//! - memo gets copy an index, never an object, so shared objects stay shared however often the
//!   pickle refers back to them.
//!
//! Lists and tuples of equal contents share their items (the `intern` module). A list filled by
//! one `APPENDS` is interned at once; one that may be filled further (CPython's pickler writes
//! a list of over [`CPYTHON_BATCH`] items as several `MARK ... APPENDS` batches, and a list
//! of one item as `APPEND`) keeps its own items while it is filled and is interned once it
//! leaves the stack (taken into its parent), when it can no longer be filled by its own batches.

use std::collections::HashMap;

use super::error::{PickleError, PickleErrorKind};
use super::intern::Interner;
use super::opcode as op;
use super::value::{
    BytesId, Container, ContainerId, NOT_SHARED, PickleDoc, PickleValue, StrId, decode_long,
};

/// How often (in input bytes) [`parse_with_progress`] reports its position.
pub const PROGRESS_STEP: usize = 1 << 20;

/// Highest protocol this reader understands.
pub const HIGHEST_PROTOCOL: u8 = 5;

/// Lowest protocol this reader understands (the first with a `PROTO` opcode).
pub const LOWEST_PROTOCOL: u8 = 2;

/// Items per `APPENDS`/`SETITEMS` batch of CPython's pickler (`BATCHSIZE` in `_pickle.c`,
/// `_BATCHSIZE` in `pickle.py`): a first batch this long may be followed by more for the same
/// list. The writer batches as CPython does.
pub const CPYTHON_BATCH: usize = 1000;

/// Decodes a pickle.
///
/// # Errors
/// A [`PickleError`] naming the byte offset and the problem: truncated input, an opcode that
/// runs code, a malformed stack, a missing memo key, invalid UTF-8, an unknown opcode.
pub fn parse(input: &[u8]) -> Result<PickleDoc<'_>, PickleError> {
    parse_with_progress(input, &mut |_| {})
}

/// Decodes a pickle, calling `progress(bytes_consumed)` about every [`PROGRESS_STEP`] bytes.
///
/// # Errors
/// As [`parse`].
pub fn parse_with_progress<'a>(
    input: &'a [u8],
    progress: &mut dyn FnMut(usize),
) -> Result<PickleDoc<'a>, PickleError> {
    if input.len() as u64 > u32::MAX as u64 {
        return Err(PickleError {
            offset: 0,
            kind: PickleErrorKind::TooLarge(input.len() as u64),
        });
    }
    let mut r = Reader {
        input,
        pos: 0,
        doc: PickleDoc::default(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
        interner: Interner::default(),
        filling: Vec::new(),
    };
    r.run(progress)?;
    Ok(r.doc)
}

/// Python's memo: a dict from int keys to objects. Keys `0..n` stored in order (what
/// `MEMOIZE` and Python's own pickler produce) live in a vector; any others in a map.
#[derive(Default)]
struct Memo {
    dense: Vec<PickleValue>,
    sparse: HashMap<u32, PickleValue>,
}

impl Memo {
    fn len(&self) -> usize {
        self.dense.len() + self.sparse.len()
    }

    fn put(&mut self, key: u32, v: PickleValue) {
        let k = key as usize;
        if k < self.dense.len() {
            self.dense[k] = v;
        } else if k == self.dense.len() && !self.sparse.contains_key(&key) {
            self.dense.push(v);
            // Keys stored out of order earlier may now continue the dense run.
            while !self.sparse.is_empty() {
                match u32::try_from(self.dense.len())
                    .ok()
                    .and_then(|next| self.sparse.remove(&next))
                {
                    Some(v) => self.dense.push(v),
                    None => break,
                }
            }
        } else {
            self.sparse.insert(key, v);
        }
    }

    fn get(&self, key: u32) -> Option<PickleValue> {
        self.dense
            .get(key as usize)
            .copied()
            .or_else(|| self.sparse.get(&key).copied())
    }
}

/// The items of container `id` of `doc`, to change them: its own copy first if they were
/// shared.
fn own_items<'d>(doc: &'d mut PickleDoc<'_>, id: ContainerId) -> &'d mut Vec<PickleValue> {
    let c = &mut doc.containers[id.0 as usize];
    if c.shared != NOT_SHARED {
        c.items = doc.shared[c.shared as usize].to_vec();
        c.shared = NOT_SHARED;
    }
    &mut c.items
}

struct Reader<'a> {
    input: &'a [u8],
    pos: usize,
    doc: PickleDoc<'a>,
    stack: Vec<PickleValue>,
    marks: Vec<usize>,
    memo: Memo,
    interner: Interner,
    /// Lists being filled batch by batch, with the stack index each was at when last filled:
    /// interned once the stack is shorter than that (the list was taken off it).
    filling: Vec<Filling>,
}

/// A list being filled by several opcodes (see the module docs).
#[derive(Clone, Copy)]
struct Filling {
    list: ContainerId,
    /// Where the list was on the stack.
    at: usize,
}

type Res<T> = Result<T, PickleError>;

impl<'a> Reader<'a> {
    fn err(&self, offset: usize, kind: PickleErrorKind) -> PickleError {
        PickleError { offset, kind }
    }

    fn malformed(&self, offset: usize, opcode: u8, message: impl Into<String>) -> PickleError {
        self.err(
            offset,
            PickleErrorKind::Malformed {
                name: op::name(opcode),
                message: message.into(),
            },
        )
    }

    /// Takes `n` argument bytes of opcode `opcode` (at `at`), checking the length first.
    #[inline]
    fn take(&mut self, n: u64, opcode: u8, at: usize) -> Res<&'a [u8]> {
        let left = (self.input.len() - self.pos) as u64;
        if n > left {
            return Err(self.err(
                at,
                PickleErrorKind::Truncated {
                    name: op::name(opcode),
                    needed: n,
                    left,
                },
            ));
        }
        let n = n as usize;
        let s = &self.input[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    #[inline]
    fn take_array<const N: usize>(&mut self, opcode: u8, at: usize) -> Res<[u8; N]> {
        let s = self.take(N as u64, opcode, at)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    #[inline]
    fn u8_arg(&mut self, opcode: u8, at: usize) -> Res<u8> {
        Ok(self.take_array::<1>(opcode, at)?[0])
    }

    #[inline]
    fn u32_arg(&mut self, opcode: u8, at: usize) -> Res<u32> {
        Ok(u32::from_le_bytes(self.take_array(opcode, at)?))
    }

    #[inline]
    fn u64_arg(&mut self, opcode: u8, at: usize) -> Res<u64> {
        Ok(u64::from_le_bytes(self.take_array(opcode, at)?))
    }

    /// The stack index below which the current mark forbids popping.
    #[inline]
    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline]
    fn pop(&mut self, opcode: u8, at: usize) -> Res<PickleValue> {
        if self.stack.len() <= self.fence() {
            return Err(self.malformed(at, opcode, "stack underflow"));
        }
        Ok(self.stack.pop().unwrap_or(PickleValue::None))
    }

    #[inline]
    fn top(&self, opcode: u8, at: usize) -> Res<PickleValue> {
        if self.stack.len() <= self.fence() {
            return Err(self.malformed(at, opcode, "stack underflow"));
        }
        Ok(self.stack[self.stack.len() - 1])
    }

    /// Pops the topmost mark and returns the stack index it marked.
    #[inline]
    fn pop_mark(&mut self, opcode: u8, at: usize) -> Res<usize> {
        match self.marks.pop() {
            Some(m) => Ok(m),
            None => Err(self.malformed(at, opcode, "no MARK on the stack")),
        }
    }

    fn new_container(&mut self, at: usize, items: Vec<PickleValue>) -> ContainerId {
        let id = ContainerId(self.doc.containers.len() as u32);
        self.doc.containers.push(Container::new(at, items));
        id
    }

    /// A list or tuple created with the stack's items above index `from` (taken off the
    /// stack), its storage shared with every earlier one of the same contents (see
    /// [`super::intern`]).
    fn new_shared_container(&mut self, at: usize, from: usize) -> ContainerId {
        let mut c = Container::new(at, Vec::new());
        match self
            .interner
            .intern(&mut self.doc.shared, &self.stack[from..])
        {
            Some(shared) => {
                c.shared = shared;
                self.stack.truncate(from);
            }
            None => c.items = self.stack.split_off(from),
        }
        let id = ContainerId(self.doc.containers.len() as u32);
        self.doc.containers.push(c);
        id
    }

    /// The items of container `id`, to change them: its own copy first if they were shared.
    fn items_mut(&mut self, id: ContainerId) -> &mut Vec<PickleValue> {
        own_items(&mut self.doc, id)
    }

    /// `APPENDS`/`SETITEMS`/`ADDITEMS` of the stack above `mark` into container `id` (a list,
    /// dict or set): a list that was empty takes a batch shorter than [`CPYTHON_BATCH`] as
    /// shared items (one `APPENDS` fills a whole traceback); a longer one, or later batches
    /// while it is filled, as its own, to be interned when it leaves the stack; anything else
    /// as its own.
    fn extend_from_stack(&mut self, id: ContainerId, mark: usize, list: bool) {
        let c = &self.doc.containers[id.0 as usize];
        let fresh = list && c.shared == NOT_SHARED && c.items.is_empty();
        if fresh
            && self.stack.len() - mark < CPYTHON_BATCH
            && mark < self.stack.len()
            && let Some(shared) = self
                .interner
                .intern(&mut self.doc.shared, &self.stack[mark..])
        {
            self.doc.containers[id.0 as usize].shared = shared;
            self.stack.truncate(mark);
            return;
        }
        own_items(&mut self.doc, id).extend(self.stack.drain(mark..));
        if fresh {
            // The list sits just below the mark.
            self.start_filling(id, mark - 1);
        }
    }

    /// Notes that list `id` (at stack index `at`) is being filled: it is interned once it
    /// leaves the stack. Lists that left the stack before are interned first.
    fn start_filling(&mut self, list: ContainerId, at: usize) {
        self.settle_filled();
        if self.filling.last().is_none_or(|f| f.list != list) {
            self.filling.push(Filling { list, at });
        }
    }

    /// Interns the lists being filled that have left the stack (it is shorter than where they
    /// were): no batch of their own can follow.
    #[inline]
    fn settle_filled(&mut self) {
        while let Some(&f) = self.filling.last()
            && self.stack.len() <= f.at
        {
            self.filling.pop();
            let c = &mut self.doc.containers[f.list.0 as usize];
            if c.shared != NOT_SHARED {
                continue;
            }
            let items = std::mem::take(&mut c.items);
            match self.interner.intern_owned(&mut self.doc.shared, items) {
                Ok(shared) => self.doc.containers[f.list.0 as usize].shared = shared,
                Err(items) => self.doc.containers[f.list.0 as usize].items = items,
            }
        }
    }

    fn push_str(&mut self, bytes: &'a [u8], opcode: u8, at: usize) -> Res<()> {
        let s = std::str::from_utf8(bytes).map_err(|_| {
            self.err(
                at,
                PickleErrorKind::BadUtf8 {
                    name: op::name(opcode),
                },
            )
        })?;
        let id = StrId(self.doc.strings.len() as u32);
        self.doc.strings.push(s);
        self.stack.push(PickleValue::Str(id));
        Ok(())
    }

    fn push_bytes(&mut self, bytes: &'a [u8]) {
        let id = BytesId(self.doc.bytes.len() as u32);
        self.doc.bytes.push(bytes);
        self.stack.push(PickleValue::Bytes(id));
    }

    fn push_long(&mut self, bytes: &'a [u8]) {
        match decode_long(bytes).and_then(|v| i64::try_from(v).ok()) {
            Some(v) => self.stack.push(PickleValue::Int(v)),
            None => {
                let id = BytesId(self.doc.bytes.len() as u32);
                self.doc.bytes.push(bytes);
                self.stack.push(PickleValue::BigInt(id));
            }
        }
    }

    /// The container `v` must be, for an opcode that mutates it.
    fn target(
        &self,
        v: PickleValue,
        want: fn(PickleValue) -> Option<ContainerId>,
        what: &str,
        opcode: u8,
        at: usize,
    ) -> Res<ContainerId> {
        want(v).ok_or_else(|| {
            self.malformed(
                at,
                opcode,
                format!("target is {}, expected a {what}", v.described()),
            )
        })
    }

    fn refuse(&self, at: usize, opcode: u8, why: &'static str) -> PickleError {
        self.err(
            at,
            PickleErrorKind::Refused {
                opcode,
                name: op::name(opcode),
                why,
            },
        )
    }

    fn memo_get(&mut self, key: u32, opcode: u8, at: usize) -> Res<()> {
        match self.memo.get(key) {
            Some(v) => {
                self.stack.push(v);
                Ok(())
            }
            None => Err(self.err(
                at,
                PickleErrorKind::MissingMemo {
                    name: op::name(opcode),
                    key,
                },
            )),
        }
    }

    fn run(&mut self, progress: &mut dyn FnMut(usize)) -> Res<()> {
        const REFUSE_CODE: &str = "it imports or calls Python code";
        const REFUSE_STATE: &str = "it needs objects from outside the pickle";
        const REFUSE_TEXT: &str = "text opcodes of protocols 0 and 1 are not supported";
        fn as_list(v: PickleValue) -> Option<ContainerId> {
            match v {
                PickleValue::List(c) => Some(c),
                _ => None,
            }
        }
        fn as_dict(v: PickleValue) -> Option<ContainerId> {
            match v {
                PickleValue::Dict(c) => Some(c),
                _ => None,
            }
        }
        fn as_set(v: PickleValue) -> Option<ContainerId> {
            match v {
                PickleValue::Set(c) => Some(c),
                _ => None,
            }
        }

        // The first opcode must be PROTO 2..=5.
        if self.input.len() < 2 || self.input[0] != op::PROTO {
            let found = self
                .input
                .iter()
                .take(4)
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ");
            return Err(self.err(
                0,
                PickleErrorKind::NotAPickle {
                    found: if found.is_empty() {
                        "nothing (empty input)".into()
                    } else {
                        found
                    },
                },
            ));
        }
        let mut next_report = PROGRESS_STEP;
        loop {
            if !self.filling.is_empty() {
                self.settle_filled();
            }
            if self.pos >= next_report {
                progress(self.pos);
                next_report = self.pos + PROGRESS_STEP;
            }
            let at = self.pos;
            let Some(&code) = self.input.get(at) else {
                return Err(self.err(at, PickleErrorKind::NoStop));
            };
            self.pos += 1;
            match code {
                op::PROTO => {
                    let v = self.u8_arg(code, at)?;
                    if !(LOWEST_PROTOCOL..=HIGHEST_PROTOCOL).contains(&v) {
                        return Err(self.err(at, PickleErrorKind::UnsupportedProtocol(v)));
                    }
                    self.doc.protocol = v;
                }
                op::FRAME => {
                    let n = self.u64_arg(code, at)?;
                    let left = (self.input.len() - self.pos) as u64;
                    if n > left {
                        return Err(self.err(
                            at,
                            PickleErrorKind::Truncated {
                                name: "FRAME",
                                needed: n,
                                left,
                            },
                        ));
                    }
                }
                op::STOP => {
                    let v = self.pop(code, at)?;
                    self.doc.root = Some(v);
                    progress(self.pos);
                    return Ok(());
                }
                op::MARK => self.marks.push(self.stack.len()),
                op::POP => {
                    if self.stack.len() > self.fence() {
                        self.stack.pop();
                    } else if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        return Err(self.malformed(at, code, "stack underflow"));
                    }
                }
                op::POP_MARK => {
                    let m = self.pop_mark(code, at)?;
                    self.stack.truncate(m);
                }
                op::DUP => {
                    let v = self.top(code, at)?;
                    self.stack.push(v);
                }
                op::NONE => self.stack.push(PickleValue::None),
                op::NEWTRUE => self.stack.push(PickleValue::Bool(true)),
                op::NEWFALSE => self.stack.push(PickleValue::Bool(false)),
                op::BININT => {
                    let v = i32::from_le_bytes(self.take_array(code, at)?);
                    self.stack.push(PickleValue::Int(v as i64));
                }
                op::BININT1 => {
                    let v = self.u8_arg(code, at)?;
                    self.stack.push(PickleValue::Int(v as i64));
                }
                op::BININT2 => {
                    let v = u16::from_le_bytes(self.take_array(code, at)?);
                    self.stack.push(PickleValue::Int(v as i64));
                }
                op::LONG1 => {
                    let n = self.u8_arg(code, at)? as u64;
                    let b = self.take(n, code, at)?;
                    self.push_long(b);
                }
                op::LONG4 => {
                    let n = i32::from_le_bytes(self.take_array(code, at)?);
                    if n < 0 {
                        return Err(self.malformed(at, code, "negative byte count"));
                    }
                    let b = self.take(n as u64, code, at)?;
                    self.push_long(b);
                }
                op::BINFLOAT => {
                    let v = f64::from_be_bytes(self.take_array(code, at)?);
                    self.stack.push(PickleValue::Float(v));
                }
                op::SHORT_BINUNICODE => {
                    let n = self.u8_arg(code, at)? as u64;
                    let b = self.take(n, code, at)?;
                    self.push_str(b, code, at)?;
                }
                op::BINUNICODE => {
                    let n = self.u32_arg(code, at)? as u64;
                    let b = self.take(n, code, at)?;
                    self.push_str(b, code, at)?;
                }
                op::BINUNICODE8 => {
                    let n = self.u64_arg(code, at)?;
                    let b = self.take(n, code, at)?;
                    self.push_str(b, code, at)?;
                }
                op::SHORT_BINSTRING | op::BINSTRING => {
                    let n = if code == op::SHORT_BINSTRING {
                        self.u8_arg(code, at)? as i64
                    } else {
                        i32::from_le_bytes(self.take_array(code, at)?) as i64
                    };
                    if n < 0 {
                        return Err(self.malformed(at, code, "negative byte count"));
                    }
                    let b = self.take(n as u64, code, at)?;
                    // Python 2 `str`: text when it is UTF-8, bytes otherwise.
                    if std::str::from_utf8(b).is_ok() {
                        self.push_str(b, code, at)?;
                    } else {
                        self.push_bytes(b);
                    }
                }
                op::SHORT_BINBYTES => {
                    let n = self.u8_arg(code, at)? as u64;
                    let b = self.take(n, code, at)?;
                    self.push_bytes(b);
                }
                op::BINBYTES => {
                    let n = self.u32_arg(code, at)? as u64;
                    let b = self.take(n, code, at)?;
                    self.push_bytes(b);
                }
                op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = self.u64_arg(code, at)?;
                    let b = self.take(n, code, at)?;
                    self.push_bytes(b);
                }
                op::READONLY_BUFFER => {
                    let v = self.top(code, at)?;
                    if !matches!(v, PickleValue::Bytes(_)) {
                        return Err(self.malformed(
                            at,
                            code,
                            format!("target is {}, expected bytes", v.described()),
                        ));
                    }
                }
                op::EMPTY_LIST => {
                    let id = self.new_container(at, Vec::new());
                    self.stack.push(PickleValue::List(id));
                }
                op::EMPTY_DICT => {
                    let id = self.new_container(at, Vec::new());
                    self.stack.push(PickleValue::Dict(id));
                }
                op::EMPTY_SET => {
                    let id = self.new_container(at, Vec::new());
                    self.stack.push(PickleValue::Set(id));
                }
                op::EMPTY_TUPLE => {
                    let id = self.new_container(at, Vec::new());
                    self.stack.push(PickleValue::Tuple(id));
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = (code - op::TUPLE1 + 1) as usize;
                    if self.stack.len() < self.fence() + n {
                        return Err(self.malformed(at, code, "stack underflow"));
                    }
                    let id = self.new_shared_container(at, self.stack.len() - n);
                    self.stack.push(PickleValue::Tuple(id));
                }
                op::TUPLE | op::LIST | op::DICT | op::FROZENSET => {
                    let m = self.pop_mark(code, at)?.min(self.stack.len());
                    if code == op::DICT && !(self.stack.len() - m).is_multiple_of(2) {
                        return Err(self.malformed(at, code, "odd number of items"));
                    }
                    let id = if code == op::TUPLE || code == op::LIST {
                        self.new_shared_container(at, m)
                    } else {
                        let items = self.stack.split_off(m);
                        self.new_container(at, items)
                    };
                    self.stack.push(match code {
                        op::TUPLE => PickleValue::Tuple(id),
                        op::LIST => PickleValue::List(id),
                        op::DICT => PickleValue::Dict(id),
                        _ => PickleValue::FrozenSet(id),
                    });
                }
                op::APPEND => {
                    let v = self.pop(code, at)?;
                    let t = self.top(code, at)?;
                    let id = self.target(t, as_list, "list", code, at)?;
                    let c = &self.doc.containers[id.0 as usize];
                    let fresh = c.shared == NOT_SHARED && c.items.is_empty();
                    self.items_mut(id).push(v);
                    // CPython writes a list of one item as `EMPTY_LIST item APPEND`.
                    if fresh {
                        self.start_filling(id, self.stack.len() - 1);
                    }
                }
                op::SETITEM => {
                    let v = self.pop(code, at)?;
                    let k = self.pop(code, at)?;
                    let t = self.top(code, at)?;
                    let id = self.target(t, as_dict, "dict", code, at)?;
                    let items = self.items_mut(id);
                    items.push(k);
                    items.push(v);
                }
                op::APPENDS | op::SETITEMS | op::ADDITEMS => {
                    let m = self.pop_mark(code, at)?;
                    if m == 0 || m <= self.fence() || m > self.stack.len() {
                        return Err(self.malformed(at, code, "stack underflow"));
                    }
                    let t = self.stack[m - 1];
                    let id = match code {
                        op::APPENDS => self.target(t, as_list, "list", code, at)?,
                        op::SETITEMS => self.target(t, as_dict, "dict", code, at)?,
                        _ => self.target(t, as_set, "set", code, at)?,
                    };
                    if code == op::SETITEMS && !(self.stack.len() - m).is_multiple_of(2) {
                        return Err(self.malformed(at, code, "odd number of items"));
                    }
                    self.extend_from_stack(id, m, code == op::APPENDS);
                }
                op::BINGET => {
                    let k = self.u8_arg(code, at)? as u32;
                    self.memo_get(k, code, at)?;
                }
                op::LONG_BINGET => {
                    let k = self.u32_arg(code, at)?;
                    self.memo_get(k, code, at)?;
                }
                op::BINPUT => {
                    let k = self.u8_arg(code, at)? as u32;
                    let v = self.top(code, at)?;
                    self.memo.put(k, v);
                }
                op::LONG_BINPUT => {
                    let k = self.u32_arg(code, at)?;
                    let v = self.top(code, at)?;
                    self.memo.put(k, v);
                }
                op::MEMOIZE => {
                    let v = self.top(code, at)?;
                    let k = u32::try_from(self.memo.len())
                        .map_err(|_| self.malformed(at, code, "memo is full"))?;
                    self.memo.put(k, v);
                }
                op::GLOBAL
                | op::STACK_GLOBAL
                | op::REDUCE
                | op::BUILD
                | op::INST
                | op::OBJ
                | op::NEWOBJ
                | op::NEWOBJ_EX => return Err(self.refuse(at, code, REFUSE_CODE)),
                op::PERSID | op::BINPERSID | op::EXT1 | op::EXT2 | op::EXT4 | op::NEXT_BUFFER => {
                    return Err(self.refuse(at, code, REFUSE_STATE));
                }
                op::INT | op::LONG | op::FLOAT | op::STRING | op::UNICODE | op::GET | op::PUT => {
                    return Err(self.refuse(at, code, REFUSE_TEXT));
                }
                other => return Err(self.err(at, PickleErrorKind::UnknownOpcode(other))),
            }
        }
    }
}
