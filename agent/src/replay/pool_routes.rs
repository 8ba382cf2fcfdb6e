//! [`PoolRoutes`]: which recorded allocations went to a private pool.
//!
//! A graph capture (or `torch.cuda.use_mem_pool`) routes allocations to a private pool
//! (`beginAllocateToPool`), whose segments no other allocation may use. PyTorch's trace entries
//! do not say which pool an allocation went to, but the final snapshot names each segment's
//! pool (`segment_pool_id`): an allocation inside a segment of a private pool went to that
//! pool. So each recorded segment still alive at the end (the last `segment_alloc` at its
//! address, or one the trace did not create) lends its pool to the allocations made inside it
//! while it lived. A private segment the trace freed is not in the final snapshot, and its
//! allocations count as the default pool's; so do those of expandable segments.

use std::collections::BTreeMap;

use allocview_alloc::caching::PoolId;
use allocview_alloc::snapshot::{Snapshot, TraceAction, TraceEntry};

use crate::addr_map::AddrMap;
use crate::replay::initial::InitialState;

/// Private pools of the recorded allocations, by trace entry index.
#[derive(Debug, Clone, Default)]
pub struct PoolRoutes {
    routes: AddrMap<PoolId>,
}

impl PoolRoutes {
    /// The routes of `entries` (the trace of `device` in `snapshot`), starting from `initial`.
    pub fn new(
        snapshot: &Snapshot,
        device: i32,
        entries: &[TraceEntry],
        initial: &InitialState,
    ) -> PoolRoutes {
        let at_end: AddrMap<(u64, PoolId)> = snapshot
            .segments
            .iter()
            .filter(|s| s.device == device && !s.is_expandable)
            .filter_map(|s| Some((s.address, (s.total_size, s.private_pool()?))))
            .collect();
        // Segments alive now: start -> (end, pool).
        let mut live: BTreeMap<u64, (u64, PoolId)> = initial
            .segments
            .iter()
            .filter_map(|s| {
                s.private_pool
                    .map(|p| (s.address, (s.address.saturating_add(s.size), p)))
            })
            .collect();
        let mut routes = AddrMap::default();
        if at_end.is_empty() && live.is_empty() {
            return PoolRoutes { routes };
        }
        // The last `segment_alloc` at each address of a private segment at the end.
        let mut last_alloc: AddrMap<usize> = AddrMap::default();
        for (i, e) in entries.iter().enumerate() {
            if e.action == TraceAction::SegmentAlloc && at_end.contains_key(&e.addr) {
                last_alloc.insert(e.addr, i);
            }
        }
        for (i, e) in entries.iter().enumerate() {
            match e.action {
                TraceAction::SegmentAlloc => {
                    if last_alloc.get(&e.addr) == Some(&i)
                        && let Some(&(size, pool)) = at_end.get(&e.addr)
                        && size == e.size
                    {
                        live.insert(e.addr, (e.addr.saturating_add(size), pool));
                    }
                }
                TraceAction::SegmentFree => {
                    live.remove(&e.addr);
                }
                TraceAction::Alloc => {
                    if let Some((_, &(end, pool))) = live.range(..=e.addr).next_back()
                        && e.addr < end
                    {
                        routes.insert(i as u64, pool);
                    }
                }
                _ => {}
            }
        }
        PoolRoutes { routes }
    }

    /// The private pool the allocation at trace entry `index` went to; `None` for the default
    /// pools.
    pub fn pool_of(&self, index: usize) -> Option<PoolId> {
        self.routes.get(&(index as u64)).copied()
    }

    /// Allocations routed to a private pool.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// No allocation went to a private pool.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}
