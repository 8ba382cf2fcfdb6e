//! The simulated device's streams and events.
//!
//! Each stream is two counters: work items submitted and work items completed (work completes
//! in order, as on a CUDA stream). Recording an event captures the stream's submitted count; the
//! event is complete once the stream's completed count reaches it. This is the happens-before
//! model of `cudaEventRecord` / `cudaEventQuery` without any timing: a test decides when work
//! finishes (`complete_stream`), or lets everything finish at once (auto-complete).

use std::collections::HashMap;

use crate::caching::backend::{DeviceError, EventId, StreamId};

/// Work on one stream.
#[derive(Debug, Default, Clone, Copy)]
struct Stream {
    /// Work items queued so far.
    submitted: u64,
    /// Work items finished so far (never above `submitted`).
    completed: u64,
}

/// Where an event was recorded.
#[derive(Debug, Clone, Copy)]
struct Recorded {
    stream: StreamId,
    /// The stream's submitted count when the event was recorded.
    captured: u64,
}

/// Streams and events of one simulated device.
#[derive(Debug)]
pub(crate) struct Streams {
    streams: HashMap<StreamId, Stream>,
    /// Live events; `None` until first recorded (an unrecorded event counts as complete, as
    /// `cudaEventQuery` reports for it).
    events: HashMap<EventId, Option<Recorded>>,
    next_stream: u64,
    next_event: u64,
}

impl Streams {
    /// Only the default stream, no events.
    pub(crate) fn new() -> Streams {
        let mut streams = HashMap::new();
        streams.insert(StreamId::DEFAULT, Stream::default());
        Streams {
            streams,
            events: HashMap::new(),
            next_stream: 1,
            next_event: 1,
        }
    }

    /// A new stream with the next unused id.
    pub(crate) fn create_stream(&mut self) -> StreamId {
        while self.streams.contains_key(&StreamId(self.next_stream)) {
            self.next_stream += 1;
        }
        let id = StreamId(self.next_stream);
        self.next_stream += 1;
        self.streams.insert(id, Stream::default());
        id
    }

    /// Makes `id` a known stream; false if it already was.
    pub(crate) fn add_stream(&mut self, id: StreamId) -> bool {
        if self.streams.contains_key(&id) {
            return false;
        }
        self.streams.insert(id, Stream::default());
        true
    }

    /// Ids of all streams, sorted.
    pub(crate) fn stream_ids(&self) -> Vec<StreamId> {
        let mut ids: Vec<_> = self.streams.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    fn stream_mut(&mut self, what: &str, id: StreamId) -> Result<&mut Stream, DeviceError> {
        self.streams
            .get_mut(&id)
            .ok_or_else(|| DeviceError::Invalid(format!("{what}: unknown stream {id}")))
    }

    /// Queues one unfinished work item on `id`.
    pub(crate) fn submit_work(&mut self, id: StreamId) -> Result<(), DeviceError> {
        let stream = self.stream_mut("submit_work", id)?;
        stream.submitted += 1;
        Ok(())
    }

    /// Work queued on `id` and not finished.
    pub(crate) fn pending_work(&self, id: StreamId) -> Option<u64> {
        self.streams.get(&id).map(|s| s.submitted - s.completed)
    }

    /// Finishes all work queued on `id` so far.
    pub(crate) fn complete_stream(&mut self, id: StreamId) -> Result<(), DeviceError> {
        let stream = self.stream_mut("complete_stream", id)?;
        stream.completed = stream.submitted;
        Ok(())
    }

    /// Finishes all work on every stream.
    pub(crate) fn complete_all(&mut self) {
        for stream in self.streams.values_mut() {
            stream.completed = stream.submitted;
        }
    }

    /// A new, unrecorded event.
    pub(crate) fn create_event(&mut self) -> EventId {
        let id = EventId(self.next_event);
        self.next_event += 1;
        self.events.insert(id, None);
        id
    }

    /// Destroys an event.
    pub(crate) fn destroy_event(&mut self, id: EventId) -> Result<(), DeviceError> {
        self.events
            .remove(&id)
            .map(|_| ())
            .ok_or_else(|| unknown_event("destroy_event", id))
    }

    /// Records `event` on `stream`, capturing the work queued there so far. With
    /// `complete_first`, that work finishes first (auto-complete).
    pub(crate) fn record_event(
        &mut self,
        event: EventId,
        stream: StreamId,
        complete_first: bool,
    ) -> Result<(), DeviceError> {
        if !self.events.contains_key(&event) {
            return Err(unknown_event("record_event", event));
        }
        let s = self.stream_mut("record_event", stream)?;
        if complete_first {
            s.completed = s.submitted;
        }
        let captured = s.submitted;
        self.events
            .insert(event, Some(Recorded { stream, captured }));
        Ok(())
    }

    /// Whether `event` has been recorded (and not destroyed).
    pub(crate) fn is_recorded(&self, what: &str, event: EventId) -> Result<bool, DeviceError> {
        self.events
            .get(&event)
            .map(Option::is_some)
            .ok_or_else(|| unknown_event(what, event))
    }

    /// Whether the work `event` captured has finished.
    pub(crate) fn is_complete(&self, what: &str, event: EventId) -> Result<bool, DeviceError> {
        match self.events.get(&event) {
            None => Err(unknown_event(what, event)),
            Some(None) => Ok(true),
            Some(Some(rec)) => Ok(self
                .streams
                .get(&rec.stream)
                .is_none_or(|s| s.completed >= rec.captured)),
        }
    }

    /// Finishes the work `event` captured (what a wait on it implies).
    pub(crate) fn complete_event(&mut self, event: EventId) -> Result<(), DeviceError> {
        match self.events.get(&event) {
            None => Err(unknown_event("synchronize_event", event)),
            Some(None) => Ok(()),
            Some(Some(rec)) => {
                let rec = *rec;
                if let Some(s) = self.streams.get_mut(&rec.stream) {
                    s.completed = s.completed.max(rec.captured);
                }
                Ok(())
            }
        }
    }

    /// Number of live events.
    pub(crate) fn live_events(&self) -> usize {
        self.events.len()
    }
}

fn unknown_event(what: &str, id: EventId) -> DeviceError {
    DeviceError::Invalid(format!(
        "{what}: unknown event {} (never created, or destroyed)",
        id.0
    ))
}
