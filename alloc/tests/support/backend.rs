//! A stand-in simulated device for the caching allocator's tests, with the same method names as
//! `SimBackend` (which replaces it once it lands).

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;

use allocview_alloc::caching::backend::{DeviceBackend, DeviceError, DevicePtr, EventId, StreamId};

const BASE: u64 = 0x7f00_0000_0000;
const VA_BASE: u64 = 0x1_0000_0000_0000;
const GRANULARITY: u64 = 2 << 20;

#[derive(Default)]
struct Inner {
    used: u64,
    next_addr: u64,
    next_va: u64,
    segments: HashMap<u64, u64>,
    mapped: HashMap<u64, u64>,
    submitted: HashMap<u64, u64>,
    completed: HashMap<u64, u64>,
    events: HashMap<u64, Option<(u64, u64)>>,
    next_event: u64,
    next_stream: u64,
    malloc_calls: u64,
    fail_nth: Option<u64>,
    auto_complete: bool,
}

/// The stand-in device.
pub struct SimBackend {
    capacity: u64,
    inner: Mutex<Inner>,
}

impl SimBackend {
    pub fn new(capacity: u64) -> SimBackend {
        SimBackend {
            capacity,
            inner: Mutex::new(Inner {
                next_addr: BASE,
                next_va: VA_BASE,
                next_stream: 1,
                auto_complete: false,
                ..Inner::default()
            }),
        }
    }
    fn st(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn used(&self) -> u64 {
        self.st().used
    }
    pub fn submit_work(&self, s: StreamId) {
        *self.st().submitted.entry(s.0).or_default() += 1;
    }
    pub fn complete_stream(&self, s: StreamId) {
        let mut st = self.st();
        let v = st.submitted.get(&s.0).copied().unwrap_or(0);
        st.completed.insert(s.0, v);
    }
    pub fn complete_all(&self) {
        let mut st = self.st();
        let subs: Vec<(u64, u64)> = st.submitted.iter().map(|(k, v)| (*k, *v)).collect();
        for (k, v) in subs {
            st.completed.insert(k, v);
        }
    }
    pub fn fail_nth_malloc(&self, n: u64) {
        let mut st = self.st();
        st.fail_nth = Some(st.malloc_calls + n);
    }
    pub fn live_segments(&self) -> usize {
        self.st().segments.len()
    }
}

impl DeviceBackend for SimBackend {
    fn device(&self) -> i32 {
        0
    }
    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let mut st = self.st();
        st.malloc_calls += 1;
        if st.fail_nth == Some(st.malloc_calls) || st.used + size > self.capacity {
            return Err(DeviceError::OutOfMemory { size });
        }
        let addr = st.next_addr;
        st.next_addr += size.div_ceil(GRANULARITY) * GRANULARITY;
        st.used += size;
        st.segments.insert(addr, size);
        Ok(addr)
    }
    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let mut st = self.st();
        let size = st
            .segments
            .remove(&ptr)
            .ok_or_else(|| DeviceError::Invalid(format!("free of unknown {ptr:#x}")))?;
        st.used -= size;
        Ok(())
    }
    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        Ok((self.capacity - self.st().used, self.capacity))
    }
    fn create_stream(&self) -> Result<StreamId, DeviceError> {
        let mut st = self.st();
        st.next_stream += 1;
        Ok(StreamId(st.next_stream - 1))
    }
    fn create_event(&self) -> Result<EventId, DeviceError> {
        let mut st = self.st();
        st.next_event += 1;
        let id = st.next_event;
        st.events.insert(id, None);
        Ok(EventId(id))
    }
    fn destroy_event(&self, e: EventId) -> Result<(), DeviceError> {
        self.st().events.remove(&e.0);
        Ok(())
    }
    fn record_event(&self, e: EventId, s: StreamId) -> Result<(), DeviceError> {
        let mut st = self.st();
        let target = st.submitted.get(&s.0).copied().unwrap_or(0);
        st.events.insert(e.0, Some((s.0, target)));
        Ok(())
    }
    fn query_event(&self, e: EventId) -> Result<bool, DeviceError> {
        let st = self.st();
        match st.events.get(&e.0) {
            Some(Some((s, t))) => Ok(st.completed.get(s).copied().unwrap_or(0) >= *t),
            Some(None) => Ok(true),
            None => Err(DeviceError::Invalid("unknown event".into())),
        }
    }
    fn synchronize_event(&self, e: EventId) -> Result<(), DeviceError> {
        let mut st = self.st();
        if let Some(Some((s, t))) = st.events.get(&e.0).copied() {
            let c = st.completed.entry(s).or_default();
            *c = (*c).max(t);
        }
        Ok(())
    }
    fn synchronize_device(&self) -> Result<(), DeviceError> {
        drop(self.st());
        self.complete_all();
        Ok(())
    }
    fn vm_granularity(&self) -> u64 {
        GRANULARITY
    }
    fn vm_reserve(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let mut st = self.st();
        let va = st.next_va;
        st.next_va += size.div_ceil(GRANULARITY) * GRANULARITY;
        Ok(va)
    }
    fn vm_map(&self, va: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let mut st = self.st();
        if st.used + size > self.capacity {
            return Err(DeviceError::OutOfMemory { size });
        }
        st.used += size;
        st.mapped.insert(va, size);
        Ok(())
    }
    fn vm_unmap(&self, va: DevicePtr, _size: u64) -> Result<(), DeviceError> {
        let mut st = self.st();
        let size = st
            .mapped
            .remove(&va)
            .ok_or_else(|| DeviceError::Invalid("unmap of unmapped page".into()))?;
        st.used -= size;
        Ok(())
    }
    fn vm_release(&self, _va: DevicePtr, _size: u64) -> Result<(), DeviceError> {
        Ok(())
    }
}
