//! The decoded pickle: a small `Copy` value type whose strings and containers live in tables of
//! a [`PickleDoc`], so that an object shared through the memo is one table entry, and a memo get
//! (`BINGET`) is a copy of its index.

use std::fmt;

pub use super::intern::SharedId;

/// Index of a container (list, tuple, dict, set) in a [`PickleDoc`]. Two values with the same
/// `ContainerId` are the same Python object (shared through the memo).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerId(pub u32);

/// Index of a string in a [`PickleDoc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StrId(pub u32);

/// Index of a byte string (or the raw bytes of a big integer) in a [`PickleDoc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BytesId(pub u32);

/// One pickled value. Scalars are held inline; everything else is an index into its
/// [`PickleDoc`].
///
/// The tag is a full word (`repr(u64)`), so a value is two aligned words and copies as two
/// moves: with a one-byte tag the compiler copies bytes 1 to 15 through overlapping stores,
/// which stalls store forwarding on every memo get (measured: a third of the parse time).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(u64)]
pub enum PickleValue {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An int that fits in 64 bits.
    Int(i64),
    /// A larger int: little-endian two's complement bytes, as `LONG1`/`LONG4` carry them.
    BigInt(BytesId),
    /// A float.
    Float(f64),
    /// A `str`.
    Str(StrId),
    /// A `bytes` or `bytearray`.
    Bytes(BytesId),
    /// A `list`.
    List(ContainerId),
    /// A `tuple`.
    Tuple(ContainerId),
    /// A `dict`.
    Dict(ContainerId),
    /// A `set`.
    Set(ContainerId),
    /// A `frozenset`.
    FrozenSet(ContainerId),
}

impl PickleValue {
    /// The value's type with its article, for messages (`an int`, `a dict`, `None`).
    pub fn described(&self) -> &'static str {
        match self {
            PickleValue::None => "None",
            PickleValue::Bool(_) => "a bool",
            PickleValue::Int(_) | PickleValue::BigInt(_) => "an int",
            PickleValue::Float(_) => "a float",
            PickleValue::Str(_) => "a str",
            PickleValue::Bytes(_) => "a bytes object",
            PickleValue::List(_) => "a list",
            PickleValue::Tuple(_) => "a tuple",
            PickleValue::Dict(_) => "a dict",
            PickleValue::Set(_) => "a set",
            PickleValue::FrozenSet(_) => "a frozenset",
        }
    }

    /// The container this value is, if it is one.
    pub fn container(&self) -> Option<ContainerId> {
        match *self {
            PickleValue::List(c)
            | PickleValue::Tuple(c)
            | PickleValue::Dict(c)
            | PickleValue::Set(c)
            | PickleValue::FrozenSet(c) => Some(c),
            _ => None,
        }
    }
}

/// Marks a [`Container`] whose items are its own (not a shared run of the document).
pub(crate) const NOT_SHARED: SharedId = SharedId::MAX;

/// A container: where it was created, and its contents (read them with [`PickleDoc::items`]).
/// Dicts hold keys and values alternately (`[k0, v0, k1, v1, ...]`), in insertion order.
#[derive(Debug, Clone)]
pub struct Container {
    /// Byte offset of the opcode that created the container (inputs are below 4 GiB).
    pub(crate) offset: u32,
    /// The shared run of items this container holds ([`NOT_SHARED`]: `items` holds them).
    pub(crate) shared: SharedId,
    /// Items, when not shared; for a dict, keys and values alternately.
    pub(crate) items: Vec<PickleValue>,
}

impl Container {
    /// A container created at byte `offset` holding `items` of its own.
    pub(crate) fn new(offset: usize, items: Vec<PickleValue>) -> Container {
        Container {
            offset: u32::try_from(offset).unwrap_or(u32::MAX),
            shared: NOT_SHARED,
            items,
        }
    }

    /// Byte offset of the opcode that created the container, for error messages.
    pub fn offset(&self) -> usize {
        self.offset as usize
    }
}

/// A decoded pickle: the root value and the tables its values index into. Strings and bytes
/// borrow from the input.
#[derive(Debug, Clone, Default)]
pub struct PickleDoc<'a> {
    pub(crate) root: Option<PickleValue>,
    pub(crate) protocol: u8,
    pub(crate) strings: Vec<&'a str>,
    pub(crate) bytes: Vec<&'a [u8]>,
    pub(crate) containers: Vec<Container>,
    /// Runs of items that several containers hold (see [`super::intern`]).
    pub(crate) shared: Vec<Box<[PickleValue]>>,
}

impl<'a> PickleDoc<'a> {
    /// The value the pickle evaluates to.
    pub fn root(&self) -> PickleValue {
        self.root.unwrap_or(PickleValue::None)
    }

    /// The protocol named by the `PROTO` opcode.
    pub fn protocol(&self) -> u8 {
        self.protocol
    }

    /// Number of containers (distinct lists, tuples, dicts and sets).
    pub fn container_count(&self) -> usize {
        self.containers.len()
    }

    /// A string's text.
    pub fn str(&self, id: StrId) -> &'a str {
        self.strings[id.0 as usize]
    }

    /// A byte string's (or big int's) bytes.
    pub fn bytes(&self, id: BytesId) -> &'a [u8] {
        self.bytes[id.0 as usize]
    }

    /// A container.
    pub fn container(&self, id: ContainerId) -> &Container {
        &self.containers[id.0 as usize]
    }

    /// The items of a list, tuple or set (a dict's keys and values alternately).
    pub fn items(&self, id: ContainerId) -> &[PickleValue] {
        let c = &self.containers[id.0 as usize];
        if c.shared == NOT_SHARED {
            &c.items
        } else {
            &self.shared[c.shared as usize]
        }
    }

    /// The run of items container `id` shares with every other container of equal contents
    /// read as a whole (a list or tuple built by one opcode), or `None` when its items are its
    /// own. Two containers with the same `SharedId` hold equal items, so what is derived from
    /// one's items holds for the other's.
    pub fn shared_items(&self, id: ContainerId) -> Option<SharedId> {
        let s = self.containers[id.0 as usize].shared;
        (s != NOT_SHARED).then_some(s)
    }

    /// Number of shared runs of items ([`Self::shared_items`] is below it).
    pub fn shared_count(&self) -> usize {
        self.shared.len()
    }

    /// The `(key, value)` pairs of a dict, in insertion order.
    pub fn dict_entries(
        &self,
        id: ContainerId,
    ) -> impl ExactSizeIterator<Item = (PickleValue, PickleValue)> + '_ {
        self.items(id).chunks_exact(2).map(|kv| (kv[0], kv[1]))
    }

    /// The value of string key `key` in dict `id` (the last one, as Python keeps, when a key
    /// was set twice).
    pub fn dict_get(&self, id: ContainerId, key: &str) -> Option<PickleValue> {
        self.items(id)
            .chunks_exact(2)
            .rev()
            .find(|kv| matches!(kv[0], PickleValue::Str(s) if self.str(s) == key))
            .map(|kv| kv[1])
    }

    /// A value as an `i128` when it is an int (of any width up to 128 bits) or a bool.
    pub fn int(&self, v: PickleValue) -> Option<i128> {
        match v {
            PickleValue::Int(i) => Some(i as i128),
            PickleValue::Bool(b) => Some(b as i128),
            PickleValue::BigInt(id) => decode_long(self.bytes(id)),
            _ => None,
        }
    }

    /// Renders a value as Python's `repr` would, cut to about `limit` characters, for error
    /// messages. Shared and recursive objects are followed only to a small depth.
    pub fn repr(&self, v: PickleValue, limit: usize) -> String {
        let mut out = String::new();
        self.repr_into(v, &mut out, limit, 0);
        if out.len() > limit {
            let mut cut = limit;
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
            out.push_str("...");
        }
        out
    }

    fn repr_into(&self, v: PickleValue, out: &mut String, limit: usize, depth: usize) {
        use fmt::Write as _;
        const REPR_DEPTH: usize = 4;
        if out.len() > limit {
            return;
        }
        match v {
            PickleValue::None => out.push_str("None"),
            PickleValue::Bool(b) => out.push_str(if b { "True" } else { "False" }),
            PickleValue::Int(i) => {
                let _ = write!(out, "{i}");
            }
            PickleValue::BigInt(id) => match decode_long(self.bytes(id)) {
                Some(i) => {
                    let _ = write!(out, "{i}");
                }
                None => {
                    let _ = write!(out, "<int of {} bytes>", self.bytes(id).len());
                }
            },
            PickleValue::Float(f) => {
                let _ = write!(out, "{f:?}");
            }
            PickleValue::Str(s) => {
                let _ = write!(out, "{:?}", self.str(s));
            }
            PickleValue::Bytes(b) => {
                let _ = write!(out, "<bytes of length {}>", self.bytes(b).len());
            }
            PickleValue::List(c)
            | PickleValue::Tuple(c)
            | PickleValue::Dict(c)
            | PickleValue::Set(c)
            | PickleValue::FrozenSet(c) => {
                let (open, close) = match v {
                    PickleValue::List(_) => ("[", "]"),
                    PickleValue::Tuple(_) => ("(", ")"),
                    PickleValue::Dict(_) | PickleValue::Set(_) => ("{", "}"),
                    _ => ("frozenset({", "})"),
                };
                out.push_str(open);
                if depth >= REPR_DEPTH {
                    out.push_str("...");
                } else if let PickleValue::Dict(_) = v {
                    for (i, (k, val)) in self.dict_entries(c).enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        self.repr_into(k, out, limit, depth + 1);
                        out.push_str(": ");
                        self.repr_into(val, out, limit, depth + 1);
                        if out.len() > limit {
                            break;
                        }
                    }
                } else {
                    for (i, item) in self.items(c).iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        self.repr_into(*item, out, limit, depth + 1);
                        if out.len() > limit {
                            break;
                        }
                    }
                }
                out.push_str(close);
            }
        }
    }
}

/// Decodes a little-endian two's complement integer of up to 16 bytes (`LONG1`/`LONG4`
/// payload); `None` when it does not fit in 128 bits.
pub fn decode_long(bytes: &[u8]) -> Option<i128> {
    if bytes.is_empty() {
        return Some(0);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    // Strip redundant sign-extension bytes so that e.g. 17 bytes of 0xff still decode.
    let fill = if negative { 0xff } else { 0x00 };
    let mut len = bytes.len();
    while len > 1 && bytes[len - 1] == fill && (bytes[len - 2] & 0x80 != 0) == negative {
        len -= 1;
    }
    if len > 16 {
        return None;
    }
    let mut buf = [fill; 16];
    buf[..len].copy_from_slice(&bytes[..len]);
    Some(i128::from_le_bytes(buf))
}

#[cfg(test)]
mod tests {
    use super::decode_long;

    #[test]
    fn decode_long_handles_sign_and_width() {
        assert_eq!(decode_long(&[]), Some(0));
        assert_eq!(decode_long(&[0xff]), Some(-1));
        assert_eq!(decode_long(&[0x00, 0x80, 0x00]), Some(0x8000));
        assert_eq!(decode_long(&[0xff; 20]), Some(-1));
        let mut big = vec![0u8; 17];
        big[16] = 1;
        assert_eq!(decode_long(&big), None);
        let u64max = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00];
        assert_eq!(decode_long(&u64max), Some(u64::MAX as i128));
    }
}
