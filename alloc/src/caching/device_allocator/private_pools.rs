//! Private pools inside the device allocator: graph captures route allocations to them
//! (PyTorch's `beginAllocateToPool`, `endAllocateToPool`, `releasePool`).

use crate::caching::pool::{BlockPool, PoolId, PrivatePool};

use super::{DeviceCachingAllocator, StreamFilter};

impl DeviceCachingAllocator {
    pub(crate) fn begin_allocate_to_pool(&mut self, id: PoolId, filter: StreamFilter) {
        if id.is_default() {
            tracing::warn!("begin_allocate_to_pool: (0, 0) names the default pools; ignored");
            return;
        }
        if let Some(c) = self.captures.iter_mut().find(|(p, _)| *p == id) {
            tracing::warn!(pool = %id, "begin_allocate_to_pool: already recording to this pool; the new stream filter replaces the old");
            c.1 = filter;
            return;
        }
        match self.private_pools.iter_mut().find(|p| p.id == id) {
            Some(pp) => pp.use_count += 1,
            None => {
                let slot = |small: bool, pools: &mut Vec<BlockPool>, free: &mut Vec<u32>| {
                    let pool = BlockPool::new(small, Some(id));
                    match free.pop() {
                        Some(s) => {
                            pools[s as usize] = pool;
                            s
                        }
                        None => {
                            pools.push(pool);
                            (pools.len() - 1) as u32
                        }
                    }
                };
                let large = slot(false, &mut self.pools, &mut self.free_pool_slots);
                let small = slot(true, &mut self.pools, &mut self.free_pool_slots);
                self.private_pools.push(PrivatePool {
                    id,
                    use_count: 1,
                    segment_count: 0,
                    large,
                    small,
                });
            }
        }
        self.captures.push((id, filter));
    }

    pub(crate) fn end_allocate_to_pool(&mut self, id: PoolId) {
        match self.captures.iter().position(|(p, _)| *p == id) {
            Some(i) => {
                self.captures.remove(i);
            }
            None => {
                tracing::warn!(pool = %id, "end_allocate_to_pool: not recording to this pool")
            }
        }
    }

    pub(crate) fn release_pool(&mut self, id: PoolId) {
        match self.private_pools.iter_mut().find(|p| p.id == id) {
            Some(pp) if pp.use_count > 0 => pp.use_count -= 1,
            Some(_) => tracing::warn!(pool = %id, "release_pool: pool already released"),
            None => tracing::warn!(pool = %id, "release_pool: no such private pool"),
        }
    }
}
