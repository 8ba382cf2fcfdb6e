//! Starting the agent's own threads (aggregator, dump writer, attach accept and client
//! threads, metrics listener) so that their heap traffic stays out of the event stream.
//!
//! With [`Instrumented`](allocview_alloc::global::Instrumented) as the process's global
//! allocator and the agent's sink set on it, every allocation the agent makes would come back
//! as a host event: the aggregator folding events, encoding client updates and writing dumps
//! would feed itself (hundreds of events a second in an idle process). Each agent thread
//! therefore runs its whole body inside [`unpublished`], the per-thread flag the heap already
//! uses to keep a sink from recursing into itself: the heap still **counts** these
//! allocations (its own counters, which a resync takes over, include them), it only does not
//! publish them. Setting the flag is one thread-local store at spawn; the allocator's hot
//! path is unchanged (it checks that flag only when a sink is set, without locking or
//! allocating).
//!
//! Memory handed between an agent thread and an application thread (a state copy a caller
//! asks for, a command it sends) is allocated on one side and freed on the other, so the host
//! counters folded from events can drift by those few small blocks; the next resync from the
//! heap's own counters corrects them.

use std::io;
use std::thread::{Builder, JoinHandle};

use allocview_alloc::global::unpublished;

/// Spawns a thread named `name` whose allocations are counted by an instrumented global
/// allocator but never published as events.
pub(crate) fn spawn<F, T>(name: impl Into<String>, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    Builder::new()
        .name(name.into())
        .spawn(move || unpublished(f))
}
