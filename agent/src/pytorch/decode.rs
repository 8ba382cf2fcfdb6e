//! Decoded pickle -> [`Snapshot`]: every layout PyTorch has written (see the table in
//! [`crate::pytorch`]) onto the one model.
//!
//! Shared objects stay shared: a frame list the pickle shares through its memo becomes one
//! [`Frames`] `Arc` (cached by the pickle container's identity), and so do lists of equal
//! content (a real trace holds thousands of list objects but about a hundred distinct stacks);
//! a frame dict is decoded once. A budget bounds the items decoded (segments, blocks, trace entries, frames, loose
//! values) by the input size, so a pickle that shares one big object many times cannot make
//! the model explode; loose values nest at most [`MAX_VALUE_DEPTH`] deep.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hasher as _;
use std::sync::Arc;

use allocview_alloc::snapshot::{
    BlockHistory, BlockInfo, BlockState, DeviceMeta, DumpedOom, Frame, Frames, SegmentInfo,
    SegmentType, Snapshot, TraceAction, TraceEntry, Value, no_frames,
};

use super::error::PytorchError;
use super::keys;
use crate::pickle::{ContainerId, PickleDoc, PickleValue};
use rustc_hash::FxHasher;

/// Deepest nesting of loose values (`allocator_settings`, `external_annotations`) accepted.
pub const MAX_VALUE_DEPTH: usize = 64;

/// Items the decoder may produce beyond one per input byte (for tiny inputs).
pub const BUDGET_SLACK: u64 = 4096;

/// Where a value sits in the snapshot, as a chain on the stack: `segments[3].blocks[7]`.
#[derive(Clone, Copy)]
struct Path<'p> {
    parent: Option<&'p Path<'p>>,
    seg: Seg<'p>,
}

#[derive(Clone, Copy)]
enum Seg<'p> {
    Root,
    Key(&'p str),
    Index(usize),
}

impl<'p> Path<'p> {
    const ROOT: Path<'static> = Path {
        parent: None,
        seg: Seg::Root,
    };

    fn key(&'p self, k: &'p str) -> Path<'p> {
        Path {
            parent: Some(self),
            seg: Seg::Key(k),
        }
    }

    fn index(&'p self, i: usize) -> Path<'p> {
        Path {
            parent: Some(self),
            seg: Seg::Index(i),
        }
    }
}

impl Path<'_> {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(p) = self.parent else {
            return Ok(());
        };
        p.write(f)?;
        let at_root = p.parent.is_none();
        match self.seg {
            Seg::Root => Ok(()),
            Seg::Key(k) if at_root => f.write_str(k),
            Seg::Key(k) => write!(f, ".{k}"),
            Seg::Index(i) => write!(f, "[{i}]"),
        }
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.parent.is_none() {
            return f.write_str("top level");
        }
        self.write(f)
    }
}

/// Decodes a snapshot from a decoded pickle. `input_len` (the pickle's size in bytes) sets the
/// decoding budget.
///
/// # Errors
/// [`PytorchError::Shape`] naming the path, key and pickle offset of the first value that is
/// missing or of the wrong type.
pub fn decode(doc: &PickleDoc<'_>, input_len: usize) -> Result<Snapshot, PytorchError> {
    let mut d = Decoder {
        doc,
        list_cache: vec![None; doc.container_count()],
        shared_cache: vec![None; doc.shared_count()],
        lists_by_items: FxMap::default(),
        lists_by_content: FxMap::default(),
        frame_ids: vec![NO_FRAME; doc.container_count()],
        frames_by_content: FxMap::default(),
        frames: Vec::new(),
        budget: input_len as u64 + BUDGET_SLACK,
    };
    d.snapshot()
}

/// The decoder's content caches hash with rustc's `FxHasher` (multiply-rotate, fast, not
/// cryptographic): keys are frame ids and short strings from the file, and a hash flood costs
/// at most time bounded by the input.
type FxMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FxHasher>>;

/// Most frame lists kept per hash in [`Decoder::lists_by_items`].
const MAX_BUCKET: usize = 8;

/// Marks a frame dict not decoded yet in [`Decoder::frame_ids`].
const NO_FRAME: u32 = u32::MAX;

struct Decoder<'d, 'a> {
    doc: &'d PickleDoc<'a>,
    /// Frame list per pickle list (by container identity).
    list_cache: Vec<Option<Frames>>,
    /// Frame list per run of items the reader shared between lists of equal contents
    /// ([`PickleDoc::shared_items`]): a traceback repeated as a list object of its own is
    /// found without looking at its items.
    shared_cache: Vec<Option<Frames>>,
    /// Frame list per sequence of frame dict objects (hash of their container ids -> lists
    /// with that hash), checked before any frame is decoded.
    lists_by_items: FxMap<u64, Vec<(ContainerId, Frames)>>,
    /// Frame list per content (the sequence of distinct-frame ids): real snapshots hold
    /// thousands of list objects but only about a hundred distinct stacks.
    lists_by_content: FxMap<Vec<u32>, Frames>,
    /// Distinct-frame id per pickle frame dict (by container identity).
    frame_ids: Vec<u32>,
    /// Distinct-frame id per content.
    frames_by_content: FxMap<(&'a str, &'a str, i64), u32>,
    /// The distinct frames.
    frames: Vec<Frame>,
    budget: u64,
}

type Res<T> = Result<T, PytorchError>;

impl<'d, 'a> Decoder<'d, 'a> {
    fn err(&self, path: &Path<'_>, offset: usize, message: impl Into<String>) -> PytorchError {
        PytorchError::Shape {
            path: path.to_string(),
            offset,
            message: message.into(),
        }
    }

    fn spend(&mut self, n: u64, path: &Path<'_>, offset: usize) -> Res<()> {
        if self.budget < n {
            return Err(self.err(
                path,
                offset,
                "the pickle refers to shared objects so often that the snapshot would be \
                 far larger than the file (refusing to expand it)",
            ));
        }
        self.budget -= n;
        Ok(())
    }

    fn offset_of(&self, v: PickleValue) -> usize {
        v.container().map_or(0, |c| self.doc.container(c).offset())
    }

    fn dict(&self, v: PickleValue, path: &Path<'_>, offset: usize) -> Res<ContainerId> {
        match v {
            PickleValue::Dict(c) => Ok(c),
            other => Err(self.err(
                path,
                offset,
                format!("is {}, expected a dict", other.described()),
            )),
        }
    }

    /// A list or tuple.
    fn list(&self, v: PickleValue, path: &Path<'_>, offset: usize) -> Res<ContainerId> {
        match v {
            PickleValue::List(c) | PickleValue::Tuple(c) => Ok(c),
            other => Err(self.err(
                path,
                offset,
                format!("is {}, expected a list", other.described()),
            )),
        }
    }

    /// List (or tuple) `v` decoded item by item: the items are charged to the budget first,
    /// then `item` decodes each at its index's path.
    fn list_of<T>(
        &mut self,
        v: PickleValue,
        path: &Path<'_>,
        offset: usize,
        mut item: impl FnMut(&mut Self, PickleValue, &Path<'_>) -> Res<T>,
    ) -> Res<Vec<T>> {
        let l = self.list(v, path, offset)?;
        let items = self.doc.items(l);
        self.spend(items.len() as u64, path, offset)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, x) in items.iter().enumerate() {
            out.push(item(self, *x, &path.index(i))?);
        }
        Ok(out)
    }

    /// The values of `keys` in dict `d`, one pass over its entries.
    fn fields<const N: usize>(&self, d: ContainerId, keys: &[&str; N]) -> [Option<PickleValue>; N] {
        let mut out = [None; N];
        for (k, v) in self.doc.dict_entries(d) {
            if let PickleValue::Str(s) = k {
                let s = self.doc.str(s);
                if let Some(i) = keys.iter().position(|k| *k == s) {
                    out[i] = Some(v);
                }
            }
        }
        out
    }

    fn required(
        &self,
        v: Option<PickleValue>,
        key: &str,
        path: &Path<'_>,
        offset: usize,
    ) -> Res<PickleValue> {
        v.ok_or_else(|| self.err(path, offset, format!("missing key '{key}'")))
    }

    fn wrong_type(
        &self,
        v: PickleValue,
        key: &str,
        want: &str,
        path: &Path<'_>,
        offset: usize,
    ) -> PytorchError {
        self.err(
            path,
            offset,
            format!("key '{key}' is {}, expected {want}", v.described()),
        )
    }

    fn int(&self, v: PickleValue, key: &str, path: &Path<'_>, offset: usize) -> Res<i128> {
        match v {
            PickleValue::Int(_) | PickleValue::BigInt(_) => self
                .doc
                .int(v)
                .ok_or_else(|| self.err(path, offset, format!("key '{key}' is an int too large"))),
            other => Err(self.wrong_type(other, key, "int", path, offset)),
        }
    }

    fn ranged<T: TryFrom<i128>>(
        &self,
        v: PickleValue,
        key: &str,
        what: &str,
        path: &Path<'_>,
        offset: usize,
    ) -> Res<T> {
        let i = self.int(v, key, path, offset)?;
        T::try_from(i)
            .map_err(|_| self.err(path, offset, format!("key '{key}' is {i}, expected {what}")))
    }

    fn u64(&self, v: Option<PickleValue>, key: &str, path: &Path<'_>, offset: usize) -> Res<u64> {
        let v = self.required(v, key, path, offset)?;
        self.ranged(v, key, "a non-negative int of 64 bits", path, offset)
    }

    fn opt_i64(
        &self,
        v: Option<PickleValue>,
        key: &str,
        path: &Path<'_>,
        offset: usize,
    ) -> Res<Option<i64>> {
        match v {
            None | Some(PickleValue::None) => Ok(None),
            Some(v) => self
                .ranged(v, key, "an int of 64 bits", path, offset)
                .map(Some),
        }
    }

    fn str(
        &self,
        v: Option<PickleValue>,
        key: &str,
        path: &Path<'_>,
        offset: usize,
    ) -> Res<&'a str> {
        match self.required(v, key, path, offset)? {
            PickleValue::Str(s) => Ok(self.doc.str(s)),
            other => Err(self.wrong_type(other, key, "str", path, offset)),
        }
    }

    fn opt_str(
        &self,
        v: Option<PickleValue>,
        key: &str,
        path: &Path<'_>,
        offset: usize,
    ) -> Res<Option<String>> {
        match v {
            None | Some(PickleValue::None) => Ok(None),
            Some(PickleValue::Str(s)) => Ok(Some(self.doc.str(s).to_string())),
            Some(other) => Err(self.wrong_type(other, key, "str or None", path, offset)),
        }
    }

    fn opt_bool(
        &self,
        v: Option<PickleValue>,
        key: &str,
        path: &Path<'_>,
        offset: usize,
    ) -> Res<bool> {
        match v {
            None => Ok(false),
            Some(PickleValue::Bool(b)) => Ok(b),
            Some(other) => Err(self.wrong_type(other, key, "bool", path, offset)),
        }
    }

    fn snapshot(&mut self) -> Res<Snapshot> {
        let root = self.doc.root();
        let path = Path::ROOT;
        match root {
            // A bare list: segments only.
            PickleValue::List(_) => {
                let segments = self.segments(root, &path.key(keys::SEGMENTS), 0)?;
                Ok(Snapshot {
                    segments,
                    ..Snapshot::default()
                })
            }
            PickleValue::Dict(d) => {
                let offset = self.doc.container(d).offset();
                let [segs, traces, settings, annotations, ours] = self.fields(
                    d,
                    &[
                        keys::SEGMENTS,
                        keys::DEVICE_TRACES,
                        keys::ALLOCATOR_SETTINGS,
                        keys::EXTERNAL_ANNOTATIONS,
                        keys::ALLOCVIEW,
                    ],
                );
                let segs = self.required(segs, keys::SEGMENTS, &path, offset)?;
                let segments = self.segments(segs, &path.key(keys::SEGMENTS), offset)?;
                let device_traces = match traces {
                    None | Some(PickleValue::None) => Vec::new(),
                    Some(t) => self.device_traces(t, &path.key(keys::DEVICE_TRACES), offset)?,
                };
                let allocator_settings = match settings {
                    None | Some(PickleValue::None) => None,
                    Some(s) => {
                        Some(self.settings(s, &path.key(keys::ALLOCATOR_SETTINGS), offset)?)
                    }
                };
                let external_annotations = match annotations {
                    None | Some(PickleValue::None) => None,
                    Some(a) => {
                        let p = path.key(keys::EXTERNAL_ANNOTATIONS);
                        let l = self.list(a, &p, offset)?;
                        let mut out = Vec::with_capacity(self.doc.items(l).len().min(1 << 16));
                        for (i, v) in self.doc.items(l).iter().enumerate() {
                            out.push(self.value(*v, &p.index(i), 0)?);
                        }
                        Some(out)
                    }
                };
                let devices = match ours {
                    None | Some(PickleValue::None) => Vec::new(),
                    Some(o) => self.allocview_meta(o, &path.key(keys::ALLOCVIEW), offset)?,
                };
                Ok(Snapshot {
                    segments,
                    device_traces,
                    allocator_settings,
                    external_annotations,
                    devices,
                })
            }
            other => Err(self.err(
                &path,
                0,
                format!(
                    "is {}, expected a dict (a snapshot) or a list (segments only)",
                    other.described()
                ),
            )),
        }
    }

    fn segments(
        &mut self,
        v: PickleValue,
        path: &Path<'_>,
        offset: usize,
    ) -> Res<Vec<SegmentInfo>> {
        self.list_of(v, path, offset, |dec, s, p| dec.segment(s, p))
    }

    fn segment(&mut self, v: PickleValue, path: &Path<'_>) -> Res<SegmentInfo> {
        let at = self.offset_of(v);
        let d = self.dict(v, path, at)?;
        let [
            device,
            address,
            total_size,
            allocated_size,
            active_size,
            requested_size,
            stream,
            segment_type,
            pool,
            expandable,
            frames,
            blocks,
        ] = self.fields(
            d,
            &[
                keys::DEVICE,
                keys::ADDRESS,
                keys::TOTAL_SIZE,
                keys::ALLOCATED_SIZE,
                keys::ACTIVE_SIZE,
                keys::REQUESTED_SIZE,
                keys::STREAM,
                keys::SEGMENT_TYPE,
                keys::SEGMENT_POOL_ID,
                keys::IS_EXPANDABLE,
                keys::FRAMES,
                keys::BLOCKS,
            ],
        );
        let device = self.required(device, keys::DEVICE, path, at)?;
        let device: i32 =
            self.ranged(device, keys::DEVICE, "a device index (32 bits)", path, at)?;
        let address = self.u64(address, keys::ADDRESS, path, at)?;
        let total_size = self.u64(total_size, keys::TOTAL_SIZE, path, at)?;
        let allocated_size = self.u64(allocated_size, keys::ALLOCATED_SIZE, path, at)?;
        let active_size = self.u64(active_size, keys::ACTIVE_SIZE, path, at)?;
        let requested_size = self.u64(requested_size, keys::REQUESTED_SIZE, path, at)?;
        let stream = self.u64(stream, keys::STREAM, path, at)?;
        let segment_type = match self.str(segment_type, keys::SEGMENT_TYPE, path, at)? {
            "small" => SegmentType::Small,
            "large" => SegmentType::Large,
            other => {
                return Err(self.err(
                    path,
                    at,
                    format!("key 'segment_type' is {other:?}, expected \"small\" or \"large\""),
                ));
            }
        };
        let segment_pool_id = match pool {
            None | Some(PickleValue::None) => (0, 0),
            Some(p) => {
                let (PickleValue::Tuple(c) | PickleValue::List(c)) = p else {
                    return Err(self.wrong_type(
                        p,
                        keys::SEGMENT_POOL_ID,
                        "a 2-tuple of ints",
                        path,
                        at,
                    ));
                };
                let items = self.doc.items(c);
                if items.len() != 2 {
                    return Err(self.err(
                        path,
                        at,
                        format!(
                            "key 'segment_pool_id' has {} items, expected 2",
                            items.len()
                        ),
                    ));
                }
                let (a, b) = (items[0], items[1]);
                (
                    self.ranged(a, keys::SEGMENT_POOL_ID, "a non-negative int", path, at)?,
                    self.ranged(b, keys::SEGMENT_POOL_ID, "a non-negative int", path, at)?,
                )
            }
        };
        let is_expandable = self.opt_bool(expandable, keys::IS_EXPANDABLE, path, at)?;
        let frames = self.opt_frames(frames, &path.key(keys::FRAMES), at)?;
        let blocks_v = self.required(blocks, keys::BLOCKS, path, at)?;
        let bpath = path.key(keys::BLOCKS);
        // Blocks tile the segment: legacy blocks without an address get the running one.
        let mut next = address;
        let blocks = self.list_of(blocks_v, &bpath, at, |dec, b, bp| {
            let block = dec.block(b, next, bp)?;
            next = block
                .address
                .checked_add(block.size)
                .ok_or_else(|| dec.err(bp, dec.offset_of(b), "address + size overflows 64 bits"))?;
            Ok(block)
        })?;
        Ok(SegmentInfo {
            device,
            address,
            total_size,
            allocated_size,
            active_size,
            requested_size,
            stream,
            segment_type,
            segment_pool_id,
            is_expandable,
            frames,
            blocks,
        })
    }

    fn block(&mut self, v: PickleValue, tiled_address: u64, path: &Path<'_>) -> Res<BlockInfo> {
        let at = self.offset_of(v);
        let d = self.dict(v, path, at)?;
        let [address, size, requested_size, state, frames, history] = self.fields(
            d,
            &[
                keys::ADDRESS,
                keys::SIZE,
                keys::REQUESTED_SIZE,
                keys::STATE,
                keys::FRAMES,
                keys::HISTORY,
            ],
        );
        let address = match address {
            None => tiled_address,
            a => self.u64(a, keys::ADDRESS, path, at)?,
        };
        let size = self.u64(size, keys::SIZE, path, at)?;
        let requested_size = self.u64(requested_size, keys::REQUESTED_SIZE, path, at)?;
        let state_s = self.str(state, keys::STATE, path, at)?;
        let state = BlockState::parse(state_s).ok_or_else(|| {
            self.err(
                path,
                at,
                format!(
                    "key 'state' is {state_s:?}, expected \"active_allocated\", \
                     \"active_pending_free\" or \"inactive\""
                ),
            )
        })?;
        let history = match history {
            None | Some(PickleValue::None) => Vec::new(),
            Some(h) => self.list_of(h, &path.key(keys::HISTORY), at, |dec, e, p| {
                dec.history(e, p)
            })?,
        };
        let frames = match frames {
            Some(f) => self.frames(f, &path.key(keys::FRAMES), at)?,
            // Legacy (2.0) blocks: the frames of the first history entry, as PyTorch's own
            // viewer (`_memory_viz._block_extra_legacy`) shows them.
            None => history.first().map_or_else(no_frames, |h| h.frames.clone()),
        };
        Ok(BlockInfo {
            address,
            size,
            requested_size,
            state,
            frames,
            history,
        })
    }

    fn history(&mut self, v: PickleValue, path: &Path<'_>) -> Res<BlockHistory> {
        let at = self.offset_of(v);
        let d = self.dict(v, path, at)?;
        let [addr, real_size, frames] =
            self.fields(d, &[keys::ADDR, keys::REAL_SIZE, keys::FRAMES]);
        Ok(BlockHistory {
            addr: self.u64(addr, keys::ADDR, path, at)?,
            real_size: self.u64(real_size, keys::REAL_SIZE, path, at)?,
            frames: self.opt_frames(frames, &path.key(keys::FRAMES), at)?,
        })
    }

    fn device_traces(
        &mut self,
        v: PickleValue,
        path: &Path<'_>,
        offset: usize,
    ) -> Res<Vec<Vec<TraceEntry>>> {
        self.list_of(v, path, offset, |dec, t, tp| {
            dec.list_of(t, tp, offset, |dec, e, p| dec.trace_entry(e, p))
        })
    }

    fn trace_entry(&mut self, v: PickleValue, path: &Path<'_>) -> Res<TraceEntry> {
        let at = self.offset_of(v);
        let d = self.dict(v, path, at)?;
        let [
            action,
            addr,
            device_free,
            size,
            stream,
            time_us,
            frames,
            compile_context,
            user_metadata,
        ] = self.fields(
            d,
            &[
                keys::ACTION,
                keys::ADDR,
                keys::DEVICE_FREE,
                keys::SIZE,
                keys::STREAM,
                keys::TIME_US,
                keys::FRAMES,
                keys::COMPILE_CONTEXT,
                keys::USER_METADATA,
            ],
        );
        let action_s = self.str(action, keys::ACTION, path, at)?;
        let action = TraceAction::parse(action_s).ok_or_else(|| {
            let names: Vec<_> = TraceAction::ALL.iter().map(|a| a.as_str()).collect();
            self.err(
                path,
                at,
                format!(
                    "key 'action' is {action_s:?}, expected one of {}",
                    names.join(", ")
                ),
            )
        })?;
        // An OOM entry carries the device's free memory as `device_free` instead of `addr`.
        let addr = if action == TraceAction::Oom && addr.is_none() {
            self.u64(device_free, keys::DEVICE_FREE, path, at)?
        } else {
            self.u64(addr, keys::ADDR, path, at)?
        };
        Ok(TraceEntry {
            action,
            addr,
            size: self.u64(size, keys::SIZE, path, at)?,
            stream: self.u64(stream, keys::STREAM, path, at)?,
            time_us: self.opt_i64(time_us, keys::TIME_US, path, at)?,
            frames: self.opt_frames(frames, &path.key(keys::FRAMES), at)?,
            compile_context: self.opt_str(compile_context, keys::COMPILE_CONTEXT, path, at)?,
            user_metadata: self.opt_str(user_metadata, keys::USER_METADATA, path, at)?,
        })
    }

    fn opt_frames(
        &mut self,
        v: Option<PickleValue>,
        path: &Path<'_>,
        offset: usize,
    ) -> Res<Frames> {
        match v {
            None | Some(PickleValue::None) => Ok(no_frames()),
            Some(f) => self.frames(f, path, offset),
        }
    }

    /// A frame list, decoded once per pickle object and shared with every list of the same
    /// content.
    fn frames(&mut self, v: PickleValue, path: &Path<'_>, offset: usize) -> Res<Frames> {
        let l = self.list(v, path, offset)?;
        if let Some(f) = &self.list_cache[l.0 as usize] {
            return Ok(Arc::clone(f));
        }
        let doc = self.doc;
        let shared = doc.shared_items(l);
        if let Some(s) = shared
            && let Some(f) = &self.shared_cache[s as usize]
        {
            let f = Arc::clone(f);
            self.list_cache[l.0 as usize] = Some(Arc::clone(&f));
            return Ok(f);
        }
        let items = doc.items(l);
        if items.is_empty() {
            return Ok(no_frames());
        }
        // A list of the same frame dict objects as one decoded before is the same stack.
        let mut h = FxHasher::default();
        for it in items {
            h.write_u64(it.container().map_or(u64::MAX, |c| c.0 as u64));
        }
        let key = h.finish();
        if let Some(bucket) = self.lists_by_items.get(&key)
            && let Some((_, f)) = bucket.iter().find(|(other, _)| doc.items(*other) == items)
        {
            let f = Arc::clone(f);
            self.list_cache[l.0 as usize] = Some(Arc::clone(&f));
            if let Some(s) = shared {
                self.shared_cache[s as usize] = Some(Arc::clone(&f));
            }
            return Ok(f);
        }
        let mut ids = Vec::with_capacity(items.len());
        for (i, f) in items.iter().enumerate() {
            ids.push(self.frame(*f, &path.index(i))?);
        }
        let frames = match self.lists_by_content.get(&ids) {
            Some(f) => Arc::clone(f),
            None => {
                self.spend(items.len() as u64, path, offset)?;
                let f: Frames = ids
                    .iter()
                    .map(|&i| self.frames[i as usize].clone())
                    .collect();
                self.lists_by_content.insert(ids, Arc::clone(&f));
                f
            }
        };
        self.list_cache[l.0 as usize] = Some(Arc::clone(&frames));
        if let Some(s) = shared {
            self.shared_cache[s as usize] = Some(Arc::clone(&frames));
        }
        let bucket = self.lists_by_items.entry(key).or_default();
        // Bounded, so that crafted hash collisions cost linear time, not quadratic.
        if bucket.len() < MAX_BUCKET {
            bucket.push((l, Arc::clone(&frames)));
        }
        Ok(frames)
    }

    /// The distinct-frame id of a frame dict.
    fn frame(&mut self, v: PickleValue, path: &Path<'_>) -> Res<u32> {
        let at = self.offset_of(v);
        let d = self.dict(v, path, at)?;
        let id = self.frame_ids[d.0 as usize];
        if id != NO_FRAME {
            return Ok(id);
        }
        let [name, filename, line] = self.fields(d, &[keys::NAME, keys::FILENAME, keys::LINE]);
        let line = self.required(line, keys::LINE, path, at)?;
        let key = (
            self.str(name, keys::NAME, path, at)?,
            self.str(filename, keys::FILENAME, path, at)?,
            self.ranged(line, keys::LINE, "an int of 64 bits", path, at)?,
        );
        let id = match self.frames_by_content.get(&key) {
            Some(&id) => id,
            None => {
                let id = self.frames.len() as u32;
                self.frames.push(Frame {
                    name: key.0.to_string(),
                    filename: key.1.to_string(),
                    line: key.2,
                });
                self.frames_by_content.insert(key, id);
                id
            }
        };
        self.frame_ids[d.0 as usize] = id;
        Ok(id)
    }

    fn settings(
        &mut self,
        v: PickleValue,
        path: &Path<'_>,
        offset: usize,
    ) -> Res<Vec<(String, Value)>> {
        let d = self.dict(v, path, offset)?;
        let n = self.doc.items(d).len() / 2;
        self.spend(n as u64, path, offset)?;
        let mut out = Vec::with_capacity(n);
        for (k, v) in self.doc.dict_entries(d) {
            let PickleValue::Str(k) = k else {
                return Err(self.err(
                    path,
                    offset,
                    format!("a key is {}, expected str", k.described()),
                ));
            };
            let key = self.doc.str(k);
            let vp = Path {
                parent: Some(path),
                seg: Seg::Key(key),
            };
            out.push((key.to_string(), self.value(v, &vp, 0)?));
        }
        Ok(out)
    }

    /// A loose value, as [`Value`].
    fn value(&mut self, v: PickleValue, path: &Path<'_>, depth: usize) -> Res<Value> {
        let at = self.offset_of(v);
        if depth > MAX_VALUE_DEPTH {
            return Err(self.err(
                path,
                at,
                format!("values nest more than {MAX_VALUE_DEPTH} deep (or refer to themselves)"),
            ));
        }
        self.spend(1, path, at)?;
        Ok(match v {
            PickleValue::None => Value::None,
            PickleValue::Bool(b) => Value::Bool(b),
            PickleValue::Int(i) => Value::Int(i),
            PickleValue::BigInt(_) => {
                let i = self
                    .doc
                    .int(v)
                    .and_then(|i| i64::try_from(i).ok())
                    .ok_or_else(|| self.err(path, at, "an int does not fit in 64 bits"))?;
                Value::Int(i)
            }
            PickleValue::Float(f) => Value::Float(f),
            PickleValue::Str(s) => Value::Str(self.doc.str(s).to_string()),
            PickleValue::List(c) | PickleValue::Tuple(c) => {
                let items = self.doc.items(c);
                let mut out = Vec::with_capacity(items.len().min(1 << 16));
                for (i, item) in items.iter().enumerate() {
                    out.push(self.value(*item, &path.index(i), depth + 1)?);
                }
                if matches!(v, PickleValue::List(_)) {
                    Value::List(out)
                } else {
                    Value::Tuple(out)
                }
            }
            PickleValue::Dict(c) => {
                let mut out = Vec::with_capacity((self.doc.items(c).len() / 2).min(1 << 16));
                for (i, (k, val)) in self.doc.dict_entries(c).enumerate() {
                    let ip = path.index(i);
                    out.push((
                        self.value(k, &ip, depth + 1)?,
                        self.value(val, &ip, depth + 1)?,
                    ));
                }
                Value::Dict(out)
            }
            other => {
                return Err(self.err(
                    path,
                    at,
                    format!("is {}, which a snapshot never holds", other.described()),
                ));
            }
        })
    }

    /// allocview's record of the OOM a dump was taken at.
    fn dumped_oom(&mut self, v: PickleValue, path: &Path<'_>, offset: usize) -> Res<DumpedOom> {
        let at = self.offset_of(v).max(offset);
        let d = self.dict(v, path, at)?;
        let [
            index,
            time_us,
            stream,
            requested,
            rounded,
            device_free,
            allocated,
            reserved,
            largest,
            inactive_split,
            event_lost,
        ] = self.fields(
            d,
            &[
                keys::OOM_INDEX,
                keys::TIME_US,
                keys::STREAM,
                keys::REQUESTED,
                keys::ROUNDED,
                keys::DEVICE_FREE,
                keys::ALLOCATED,
                keys::RESERVED,
                keys::LARGEST_FREE_BLOCK,
                keys::INACTIVE_SPLIT_BYTES,
                keys::EVENT_LOST,
            ],
        );
        let time_us = self.required(time_us, keys::TIME_US, path, at)?;
        Ok(DumpedOom {
            index: self.u64(index, keys::OOM_INDEX, path, at)?,
            time_us: self.ranged(time_us, keys::TIME_US, "an int of 64 bits", path, at)?,
            stream: self.u64(stream, keys::STREAM, path, at)?,
            requested: self.u64(requested, keys::REQUESTED, path, at)?,
            rounded: self.u64(rounded, keys::ROUNDED, path, at)?,
            device_free: self.u64(device_free, keys::DEVICE_FREE, path, at)?,
            allocated: self.u64(allocated, keys::ALLOCATED, path, at)?,
            reserved: self.u64(reserved, keys::RESERVED, path, at)?,
            largest_free_block: self.u64(largest, keys::LARGEST_FREE_BLOCK, path, at)?,
            inactive_split_bytes: self.u64(inactive_split, keys::INACTIVE_SPLIT_BYTES, path, at)?,
            event_lost: self.opt_bool(event_lost, keys::EVENT_LOST, path, at)?,
        })
    }

    fn allocview_meta(
        &mut self,
        v: PickleValue,
        path: &Path<'_>,
        offset: usize,
    ) -> Res<Vec<DeviceMeta>> {
        let d = self.dict(v, path, offset)?;
        let [devices] = self.fields(d, &[keys::DEVICES]);
        let Some(devices) = devices else {
            return Ok(Vec::new());
        };
        let dp = path.key(keys::DEVICES);
        self.list_of(devices, &dp, offset, |dec, m, mp| {
            let at = dec.offset_of(m);
            let md = dec.dict(m, mp, at)?;
            let [device, total_memory, trace_overflow, oom] = dec.fields(
                md,
                &[
                    keys::DEVICE,
                    keys::TOTAL_MEMORY,
                    keys::TRACE_OVERFLOW,
                    keys::OOM,
                ],
            );
            let device = dec.required(device, keys::DEVICE, mp, at)?;
            Ok(DeviceMeta {
                device: dec.ranged(device, keys::DEVICE, "a device index (32 bits)", mp, at)?,
                total_memory: match total_memory {
                    None | Some(PickleValue::None) => None,
                    t => Some(dec.u64(t, keys::TOTAL_MEMORY, mp, at)?),
                },
                trace_overflow: dec.u64(trace_overflow, keys::TRACE_OVERFLOW, mp, at)?,
                oom: match oom {
                    None | Some(PickleValue::None) => None,
                    Some(o) => Some(dec.dumped_oom(o, &mp.key(keys::OOM), at)?),
                },
            })
        })
    }
}
