//! How a test or benchmark hands a slice of events to a sink.

#![allow(dead_code)]

use allocview_alloc::event::{Event, EventSink};

/// How a slice of events goes to a sink.
#[derive(Clone, Copy, Debug)]
pub enum Publish {
    /// One `publish` per event (the tracking and heap allocators).
    OneByOne,
    /// One `publish_batch` of the whole slice (the sink splits it every `MAX_BATCH` events), as
    /// the caching allocator publishes.
    Batch,
    /// One `publish_batch` per this many events.
    BatchesOf(usize),
}

impl Publish {
    /// Sends `events` to `sink` this way.
    #[inline(always)]
    pub fn send<S: EventSink + ?Sized>(self, sink: &S, events: &[Event]) {
        match self {
            Publish::OneByOne => {
                for e in events {
                    sink.publish(e);
                }
            }
            Publish::Batch => sink.publish_batch(events),
            Publish::BatchesOf(n) => {
                for chunk in events.chunks(n) {
                    sink.publish_batch(chunk);
                }
            }
        }
    }
}
