//! [`Snapshot`] -> PyTorch's snapshot pickle, newest layout, written so that PyTorch's own tools
//! (`_memory_viz.py`, the browser viewer) read it:
//!
//! - segments with `address`/`frames` blocks (a legacy block's `history` is kept beside them);
//!   a segment's `allocated_size`, `active_size` and `requested_size` are recomputed from its
//!   blocks, so they always agree;
//! - trace entries with `time_us`, `compile_context` and `user_metadata` only when known, and
//!   `device_free` instead of `addr` for OOM entries, as PyTorch writes them;
//! - `allocator_settings` / `external_annotations` when present, and an extra top-level
//!   `allocview` dict with the device metadata when there is any;
//! - shared objects written once and referred back to with `BINGET`, as CPython's pickler does:
//!   every frame list (by identity, then by content), every frame dict, every repeated string.

use std::collections::HashMap;

use allocview_alloc::snapshot::{
    BlockInfo, DumpedOom, Frame, Frames, SegmentInfo, Snapshot, TraceAction, TraceEntry, Value,
    segment_sums,
};

use super::keys;
use crate::pickle::PickleWriter;

/// Items per `APPENDS`/`SETITEMS` batch, as CPython's pickler.
const BATCH_SIZE: usize = crate::pickle::reader::CPYTHON_BATCH;

/// Encodes a snapshot as a protocol 4 pickle.
pub fn encode(snapshot: &Snapshot) -> Vec<u8> {
    encode_with(snapshot, Lists::ByContent)
}

/// Which frame lists are written once and referred back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lists {
    /// Every list of equal frames (the smallest file).
    ByContent,
    /// None: every trace entry's and block's frames are a list object of their own (frame
    /// dicts are still shared), as PyTorch's `_dump_snapshot` writes them, where every call
    /// captures a traceback of its own and only frames are shared by content (PyTorch
    /// also shares a block's traceback with its `alloc` entry's).
    PerUse,
}

/// Encodes a snapshot as a protocol 4 pickle, sharing frame lists as `lists` says.
pub fn encode_with(snapshot: &Snapshot, lists: Lists) -> Vec<u8> {
    let mut e = Encoder {
        lists,
        w: PickleWriter::new(),
        strings: HashMap::new(),
        lists_by_ptr: HashMap::new(),
        lists_by_content: HashMap::new(),
        frames: HashMap::new(),
    };
    e.snapshot(snapshot);
    e.w.finish()
}

struct Encoder<'s> {
    lists: Lists,
    w: PickleWriter,
    strings: HashMap<&'s str, u32>,
    lists_by_ptr: HashMap<usize, u32>,
    lists_by_content: HashMap<&'s [Frame], u32>,
    frames: HashMap<&'s Frame, u32>,
}

impl<'s> Encoder<'s> {
    /// A string, memoized: written once, then referred back to.
    fn str(&mut self, s: &'s str) {
        if let Some(&i) = self.strings.get(s) {
            self.w.get(i);
        } else {
            self.w.str(s);
            let i = self.w.memoize();
            self.strings.insert(s, i);
        }
    }

    /// Writes `key: value` pairs of a dict whose `EMPTY_DICT` is on the stack.
    fn dict(&mut self, body: impl FnOnce(&mut Self)) {
        self.w.empty_dict();
        self.w.mark();
        body(self);
        self.w.setitems();
    }

    fn list<T>(&mut self, items: &'s [T], mut each: impl FnMut(&mut Self, &'s T)) {
        self.w.empty_list();
        for chunk in items.chunks(BATCH_SIZE) {
            self.w.mark();
            for item in chunk {
                each(self, item);
            }
            self.w.appends();
        }
    }

    fn snapshot(&mut self, s: &'s Snapshot) {
        self.dict(|e| {
            e.str(keys::SEGMENTS);
            e.list(&s.segments, |e, seg| e.segment(seg));
            e.str(keys::DEVICE_TRACES);
            e.list(&s.device_traces, |e, trace| {
                e.list(trace, |e, entry| e.trace_entry(entry));
            });
            if let Some(settings) = &s.allocator_settings {
                e.str(keys::ALLOCATOR_SETTINGS);
                e.w.empty_dict();
                if !settings.is_empty() {
                    e.w.mark();
                    for (k, v) in settings {
                        e.str(k);
                        e.value(v);
                    }
                    e.w.setitems();
                }
            }
            if let Some(ann) = &s.external_annotations {
                e.str(keys::EXTERNAL_ANNOTATIONS);
                e.list(ann, |e, v| e.value(v));
            }
            if !s.devices.is_empty() {
                e.str(keys::ALLOCVIEW);
                e.dict(|e| {
                    e.str(keys::DEVICES);
                    e.list(&s.devices, |e, d| {
                        e.dict(|e| {
                            e.str(keys::DEVICE);
                            e.w.int(d.device as i64);
                            e.str(keys::TOTAL_MEMORY);
                            match d.total_memory {
                                Some(t) => e.w.uint(t),
                                None => e.w.none(),
                            }
                            e.str(keys::TRACE_OVERFLOW);
                            e.w.uint(d.trace_overflow);
                            if let Some(oom) = &d.oom {
                                e.str(keys::OOM);
                                e.dumped_oom(oom);
                            }
                        });
                    });
                });
            }
        });
    }

    /// allocview's record of the OOM a dump was taken at (`event_lost` only when set).
    fn dumped_oom(&mut self, oom: &DumpedOom) {
        self.dict(|e| {
            let counts = [
                (keys::OOM_INDEX, oom.index),
                (keys::STREAM, oom.stream),
                (keys::REQUESTED, oom.requested),
                (keys::ROUNDED, oom.rounded),
                (keys::DEVICE_FREE, oom.device_free),
                (keys::ALLOCATED, oom.allocated),
                (keys::RESERVED, oom.reserved),
                (keys::LARGEST_FREE_BLOCK, oom.largest_free_block),
                (keys::INACTIVE_SPLIT_BYTES, oom.inactive_split_bytes),
            ];
            for (key, value) in counts {
                e.str(key);
                e.w.uint(value);
            }
            e.str(keys::TIME_US);
            e.w.int(oom.time_us);
            if oom.event_lost {
                e.str(keys::EVENT_LOST);
                e.w.bool(true);
            }
        });
    }

    fn segment(&mut self, seg: &'s SegmentInfo) {
        let (allocated, active, requested) = segment_sums(&seg.blocks);
        self.dict(|e| {
            e.str(keys::DEVICE);
            e.w.int(seg.device as i64);
            e.str(keys::ADDRESS);
            e.w.uint(seg.address);
            e.str(keys::TOTAL_SIZE);
            e.w.uint(seg.total_size);
            e.str(keys::ALLOCATED_SIZE);
            e.w.uint(allocated);
            e.str(keys::ACTIVE_SIZE);
            e.w.uint(active);
            e.str(keys::REQUESTED_SIZE);
            e.w.uint(requested);
            e.str(keys::STREAM);
            e.w.uint(seg.stream);
            e.str(keys::SEGMENT_TYPE);
            e.str(seg.segment_type.as_str());
            e.str(keys::SEGMENT_POOL_ID);
            e.w.uint(seg.segment_pool_id.0);
            e.w.uint(seg.segment_pool_id.1);
            e.w.tuple(Some(2));
            e.str(keys::IS_EXPANDABLE);
            e.w.bool(seg.is_expandable);
            e.str(keys::FRAMES);
            e.frames(&seg.frames);
            e.str(keys::BLOCKS);
            e.list(&seg.blocks, |e, b| e.block(b));
        });
    }

    fn block(&mut self, b: &'s BlockInfo) {
        self.dict(|e| {
            e.str(keys::ADDRESS);
            e.w.uint(b.address);
            e.str(keys::SIZE);
            e.w.uint(b.size);
            e.str(keys::REQUESTED_SIZE);
            e.w.uint(b.requested_size);
            e.str(keys::STATE);
            e.str(b.state.as_str());
            e.str(keys::FRAMES);
            e.frames(&b.frames);
            if !b.history.is_empty() {
                e.str(keys::HISTORY);
                e.list(&b.history, |e, h| {
                    e.dict(|e| {
                        e.str(keys::ADDR);
                        e.w.uint(h.addr);
                        e.str(keys::REAL_SIZE);
                        e.w.uint(h.real_size);
                        e.str(keys::FRAMES);
                        e.frames(&h.frames);
                    });
                });
            }
        });
    }

    fn trace_entry(&mut self, t: &'s TraceEntry) {
        self.dict(|e| {
            e.str(keys::ACTION);
            e.str(t.action.as_str());
            e.str(if t.action == TraceAction::Oom {
                keys::DEVICE_FREE
            } else {
                keys::ADDR
            });
            e.w.uint(t.addr);
            e.str(keys::SIZE);
            e.w.uint(t.size);
            e.str(keys::STREAM);
            e.w.uint(t.stream);
            if let Some(time) = t.time_us {
                e.str(keys::TIME_US);
                e.w.int(time);
            }
            if let Some(c) = &t.compile_context {
                e.str(keys::COMPILE_CONTEXT);
                e.str(c);
            }
            if let Some(m) = &t.user_metadata {
                e.str(keys::USER_METADATA);
                e.str(m);
            }
            e.str(keys::FRAMES);
            e.frames(&t.frames);
        });
    }

    /// A frame list: with [`Lists::ByContent`], written once, then referred back to (by `Arc`
    /// identity, then content); with [`Lists::PerUse`], written every time.
    fn frames(&mut self, f: &'s Frames) {
        if f.is_empty() {
            self.w.empty_list();
            return;
        }
        let ptr = f.as_ptr() as usize;
        let share = self.lists == Lists::ByContent;
        if share && let Some(&i) = self.lists_by_ptr.get(&ptr) {
            self.w.get(i);
            return;
        }
        let content: &'s [Frame] = f;
        if share && let Some(&i) = self.lists_by_content.get(content) {
            self.lists_by_ptr.insert(ptr, i);
            self.w.get(i);
            return;
        }
        self.w.empty_list();
        let i = self.w.memoize();
        for chunk in content.chunks(BATCH_SIZE) {
            self.w.mark();
            for frame in chunk {
                self.frame(frame);
            }
            self.w.appends();
        }
        if share {
            self.lists_by_ptr.insert(ptr, i);
            self.lists_by_content.insert(content, i);
        }
    }

    fn frame(&mut self, f: &'s Frame) {
        if let Some(&i) = self.frames.get(f) {
            self.w.get(i);
            return;
        }
        self.w.empty_dict();
        let i = self.w.memoize();
        self.w.mark();
        self.str(keys::NAME);
        self.str(&f.name);
        self.str(keys::FILENAME);
        self.str(&f.filename);
        self.str(keys::LINE);
        self.w.int(f.line);
        self.w.setitems();
        self.frames.insert(f, i);
    }

    fn value(&mut self, v: &'s Value) {
        match v {
            Value::None => self.w.none(),
            Value::Bool(b) => self.w.bool(*b),
            Value::Int(i) => self.w.int(*i),
            Value::Float(f) => self.w.float(*f),
            Value::Str(s) => self.str(s),
            Value::List(items) => self.list(items, |e, v| e.value(v)),
            Value::Tuple(items) => match items.len() {
                0 => self.w.empty_tuple(),
                n @ 1..=3 => {
                    for item in items {
                        self.value(item);
                    }
                    self.w.tuple(Some(n));
                }
                _ => {
                    self.w.mark();
                    for item in items {
                        self.value(item);
                    }
                    self.w.tuple(None);
                }
            },
            Value::Dict(entries) => {
                self.w.empty_dict();
                for chunk in entries.chunks(BATCH_SIZE) {
                    self.w.mark();
                    for (k, v) in chunk {
                        self.value(k);
                        self.value(v);
                    }
                    self.w.setitems();
                }
            }
        }
    }
}
