//! Pickle opcodes (protocols 0 to 5), with the names CPython's `pickletools` gives them.
//!
//! Reference: CPython `Lib/pickle.py` and `Lib/pickletools.py` (the opcode table, with the
//! protocol that introduced each opcode).

/// Push a mark onto the mark stack.
pub const MARK: u8 = b'(';
/// End of the pickle: the top of the stack is the result.
pub const STOP: u8 = b'.';
/// Discard the top of the stack.
pub const POP: u8 = b'0';
/// Discard everything down to the topmost mark.
pub const POP_MARK: u8 = b'1';
/// Push a copy of the top of the stack.
pub const DUP: u8 = b'2';
/// Float as a text line (protocol 0).
pub const FLOAT: u8 = b'F';
/// Int as a text line (protocol 0).
pub const INT: u8 = b'I';
/// 4-byte signed little-endian int.
pub const BININT: u8 = b'J';
/// 1-byte unsigned int.
pub const BININT1: u8 = b'K';
/// Long as a text line (protocol 0).
pub const LONG: u8 = b'L';
/// 2-byte unsigned little-endian int.
pub const BININT2: u8 = b'M';
/// Push None.
pub const NONE: u8 = b'N';
/// Persistent id as a text line: calls the unpickler's `persistent_load`.
pub const PERSID: u8 = b'P';
/// Persistent id from the stack: calls `persistent_load`.
pub const BINPERSID: u8 = b'Q';
/// Call a callable with an argument tuple.
pub const REDUCE: u8 = b'R';
/// Quoted string as a text line (protocol 0).
pub const STRING: u8 = b'S';
/// String with a 4-byte length (protocol 1, Python 2 `str`).
pub const BINSTRING: u8 = b'T';
/// String with a 1-byte length (protocol 1, Python 2 `str`).
pub const SHORT_BINSTRING: u8 = b'U';
/// Raw-unicode-escaped text line (protocol 0).
pub const UNICODE: u8 = b'V';
/// UTF-8 string with a 4-byte length.
pub const BINUNICODE: u8 = b'X';
/// Append the top of the stack to the list below it.
pub const APPEND: u8 = b'a';
/// Call `__setstate__` or update `__dict__`.
pub const BUILD: u8 = b'b';
/// Import a module attribute named by two text lines.
pub const GLOBAL: u8 = b'c';
/// Build a dict from the items above the mark.
pub const DICT: u8 = b'd';
/// Push an empty dict.
pub const EMPTY_DICT: u8 = b'}';
/// Extend the list below the mark with the items above it.
pub const APPENDS: u8 = b'e';
/// Memo get by a text key (protocol 0).
pub const GET: u8 = b'g';
/// Memo get, 1-byte key.
pub const BINGET: u8 = b'h';
/// Build a class instance from text lines.
pub const INST: u8 = b'i';
/// Memo get, 4-byte key.
pub const LONG_BINGET: u8 = b'j';
/// Build a list from the items above the mark.
pub const LIST: u8 = b'l';
/// Push an empty list.
pub const EMPTY_LIST: u8 = b']';
/// Build a class instance from the stack.
pub const OBJ: u8 = b'o';
/// Memo put by a text key (protocol 0).
pub const PUT: u8 = b'p';
/// Memo put, 1-byte key.
pub const BINPUT: u8 = b'q';
/// Memo put, 4-byte key.
pub const LONG_BINPUT: u8 = b'r';
/// Set one key of the dict below.
pub const SETITEM: u8 = b's';
/// Build a tuple from the items above the mark.
pub const TUPLE: u8 = b't';
/// Push an empty tuple.
pub const EMPTY_TUPLE: u8 = b')';
/// Set the key/value pairs above the mark in the dict below it.
pub const SETITEMS: u8 = b'u';
/// 8-byte big-endian IEEE double.
pub const BINFLOAT: u8 = b'G';
/// Protocol version (2 and newer).
pub const PROTO: u8 = 0x80;
/// `cls.__new__(cls, *args)`.
pub const NEWOBJ: u8 = 0x81;
/// Extension registry lookup, 1-byte code.
pub const EXT1: u8 = 0x82;
/// Extension registry lookup, 2-byte code.
pub const EXT2: u8 = 0x83;
/// Extension registry lookup, 4-byte code.
pub const EXT4: u8 = 0x84;
/// Build a 1-tuple from the top of the stack.
pub const TUPLE1: u8 = 0x85;
/// Build a 2-tuple from the top two items.
pub const TUPLE2: u8 = 0x86;
/// Build a 3-tuple from the top three items.
pub const TUPLE3: u8 = 0x87;
/// Push True.
pub const NEWTRUE: u8 = 0x88;
/// Push False.
pub const NEWFALSE: u8 = 0x89;
/// Little-endian two's complement int with a 1-byte length.
pub const LONG1: u8 = 0x8a;
/// Little-endian two's complement int with a 4-byte length.
pub const LONG4: u8 = 0x8b;
/// Bytes with a 4-byte length (protocol 3).
pub const BINBYTES: u8 = b'B';
/// Bytes with a 1-byte length (protocol 3).
pub const SHORT_BINBYTES: u8 = b'C';
/// UTF-8 string with a 1-byte length (protocol 4).
pub const SHORT_BINUNICODE: u8 = 0x8c;
/// UTF-8 string with an 8-byte length (protocol 4).
pub const BINUNICODE8: u8 = 0x8d;
/// Bytes with an 8-byte length (protocol 4).
pub const BINBYTES8: u8 = 0x8e;
/// Push an empty set (protocol 4).
pub const EMPTY_SET: u8 = 0x8f;
/// Add the items above the mark to the set below it (protocol 4).
pub const ADDITEMS: u8 = 0x90;
/// Build a frozenset from the items above the mark (protocol 4).
pub const FROZENSET: u8 = 0x91;
/// `cls.__new__(cls, *args, **kwargs)` (protocol 4).
pub const NEWOBJ_EX: u8 = 0x92;
/// Import a module attribute named by two strings on the stack (protocol 4).
pub const STACK_GLOBAL: u8 = 0x93;
/// Store the top of the stack in the next memo slot (protocol 4).
pub const MEMOIZE: u8 = 0x94;
/// Start of a frame with an 8-byte length (protocol 4).
pub const FRAME: u8 = 0x95;
/// Bytearray with an 8-byte length (protocol 5).
pub const BYTEARRAY8: u8 = 0x96;
/// Take the next out-of-band buffer (protocol 5).
pub const NEXT_BUFFER: u8 = 0x97;
/// Make the top of the stack a read-only view (protocol 5).
pub const READONLY_BUFFER: u8 = 0x98;

/// The `pickletools` name of an opcode, or `"unknown"`.
pub fn name(op: u8) -> &'static str {
    match op {
        MARK => "MARK",
        STOP => "STOP",
        POP => "POP",
        POP_MARK => "POP_MARK",
        DUP => "DUP",
        FLOAT => "FLOAT",
        INT => "INT",
        BININT => "BININT",
        BININT1 => "BININT1",
        LONG => "LONG",
        BININT2 => "BININT2",
        NONE => "NONE",
        PERSID => "PERSID",
        BINPERSID => "BINPERSID",
        REDUCE => "REDUCE",
        STRING => "STRING",
        BINSTRING => "BINSTRING",
        SHORT_BINSTRING => "SHORT_BINSTRING",
        UNICODE => "UNICODE",
        BINUNICODE => "BINUNICODE",
        APPEND => "APPEND",
        BUILD => "BUILD",
        GLOBAL => "GLOBAL",
        DICT => "DICT",
        EMPTY_DICT => "EMPTY_DICT",
        APPENDS => "APPENDS",
        GET => "GET",
        BINGET => "BINGET",
        INST => "INST",
        LONG_BINGET => "LONG_BINGET",
        LIST => "LIST",
        EMPTY_LIST => "EMPTY_LIST",
        OBJ => "OBJ",
        PUT => "PUT",
        BINPUT => "BINPUT",
        LONG_BINPUT => "LONG_BINPUT",
        SETITEM => "SETITEM",
        TUPLE => "TUPLE",
        EMPTY_TUPLE => "EMPTY_TUPLE",
        SETITEMS => "SETITEMS",
        BINFLOAT => "BINFLOAT",
        PROTO => "PROTO",
        NEWOBJ => "NEWOBJ",
        EXT1 => "EXT1",
        EXT2 => "EXT2",
        EXT4 => "EXT4",
        TUPLE1 => "TUPLE1",
        TUPLE2 => "TUPLE2",
        TUPLE3 => "TUPLE3",
        NEWTRUE => "NEWTRUE",
        NEWFALSE => "NEWFALSE",
        LONG1 => "LONG1",
        LONG4 => "LONG4",
        BINBYTES => "BINBYTES",
        SHORT_BINBYTES => "SHORT_BINBYTES",
        SHORT_BINUNICODE => "SHORT_BINUNICODE",
        BINUNICODE8 => "BINUNICODE8",
        BINBYTES8 => "BINBYTES8",
        EMPTY_SET => "EMPTY_SET",
        ADDITEMS => "ADDITEMS",
        FROZENSET => "FROZENSET",
        NEWOBJ_EX => "NEWOBJ_EX",
        STACK_GLOBAL => "STACK_GLOBAL",
        MEMOIZE => "MEMOIZE",
        FRAME => "FRAME",
        BYTEARRAY8 => "BYTEARRAY8",
        NEXT_BUFFER => "NEXT_BUFFER",
        READONLY_BUFFER => "READONLY_BUFFER",
        _ => "unknown",
    }
}
