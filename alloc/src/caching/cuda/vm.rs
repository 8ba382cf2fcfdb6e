//! Virtual memory as RAII handles: a reserved address range, and the physical pages mapped
//! into it (the driver calls behind PyTorch's expandable segments).
//!
//! Each mapped page is its own physical allocation (`cuMemCreate` of one granularity unit,
//! `cuMemMap`ped at its address), because the driver can only unmap whole mappings: one handle
//! per page is what lets the allocator unmap any page-aligned sub-range of what it mapped,
//! exactly as on the simulated device. PyTorch's expandable segments keep one handle per
//! segment page for the same reason.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::sys;

use super::context::PrimaryContext;
use super::result::{self, DriverStatus};

/// One page of physical memory mapped at `va`.
#[derive(Debug)]
pub(crate) struct MappedPage {
    ctx: Arc<PrimaryContext>,
    va: u64,
    size: u64,
    handle: sys::CUmemGenericAllocationHandle,
    /// Set once unmapped and released (or given up on), so `drop` does nothing.
    gone: bool,
}

impl MappedPage {
    /// Creates `size` bytes of physical memory with `prop` and maps it at `va`.
    ///
    /// # Safety
    /// 1. `[va, va + size)` lies inside a live reservation of `ctx`'s device and nothing is
    ///    mapped there.
    /// 2. `size` is a multiple of the allocation granularity for `prop`.
    pub(crate) unsafe fn map(
        ctx: &Arc<PrimaryContext>,
        va: u64,
        size: u64,
        prop: &sys::CUmemAllocationProp,
    ) -> Result<MappedPage, DriverStatus> {
        let bytes = size as usize;
        let handle = result::mem_create(bytes, prop)?;
        // SAFETY: the caller guarantees the range (1); `handle` was just created with `bytes`
        // bytes (2).
        if let Err(status) = unsafe { result::mem_map(va, bytes, handle) } {
            // SAFETY: `handle` was created above, is not mapped, and is released once, here.
            if let Err(release) = unsafe { result::mem_release(handle) } {
                tracing::warn!(?release, "releasing an unmapped CUDA allocation failed");
            }
            return Err(status);
        }
        Ok(MappedPage {
            ctx: Arc::clone(ctx),
            va,
            size,
            handle,
            gone: false,
        })
    }

    /// The page's address.
    pub(crate) fn va(&self) -> u64 {
        self.va
    }

    /// Unmaps the page and releases its physical memory. If unmapping fails the page is left
    /// as it is (its state is unknown) and the error returned.
    pub(crate) fn unmap(mut self) -> Result<(), DriverStatus> {
        self.gone = true;
        self.unmap_and_release()
    }

    fn unmap_and_release(&self) -> Result<(), DriverStatus> {
        // SAFETY: `[va, va + size)` is the one mapping `map` made and it is unmapped only
        // here, once (`gone` guards `drop`). The allocator only unmaps pages no work uses.
        unsafe { result::mem_unmap(self.va, self.size as usize) }?;
        // SAFETY: `handle` came from `mem_create` and is released only here, once, after
        // its only mapping went away.
        unsafe { result::mem_release(self.handle) }
    }
}

impl Drop for MappedPage {
    fn drop(&mut self) {
        if self.gone {
            return;
        }
        let _ = self.ctx.bind();
        if let Err(status) = self.unmap_and_release() {
            tracing::warn!(?status, va = self.va, "unmapping a CUDA page failed");
        }
    }
}

/// A reserved range of device address space and the pages mapped in it, by address.
#[derive(Debug)]
pub(crate) struct Reservation {
    ctx: Arc<PrimaryContext>,
    va: u64,
    size: u64,
    /// Mapped pages, keyed by address; each one granularity unit long.
    pub(crate) pages: BTreeMap<u64, MappedPage>,
    /// Set once the address range was given back, so `drop` does nothing.
    gone: bool,
}

impl Reservation {
    /// Reserves `size` bytes of address space aligned to `alignment` (a page, so that every
    /// page of the range is aligned too), with `ctx` current on this thread.
    pub(crate) fn reserve(
        ctx: &Arc<PrimaryContext>,
        size: u64,
        alignment: u64,
    ) -> Result<Reservation, DriverStatus> {
        let va = result::address_reserve(size as usize, alignment as usize)?;
        Ok(Reservation {
            ctx: Arc::clone(ctx),
            va,
            size,
            pages: BTreeMap::new(),
            gone: false,
        })
    }

    /// First address.
    pub(crate) fn va(&self) -> u64 {
        self.va
    }

    /// Length in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Gives the address range back; every page must have been unmapped.
    pub(crate) fn release(mut self) -> Result<(), DriverStatus> {
        debug_assert!(self.pages.is_empty());
        self.gone = true;
        // SAFETY: the range is exactly what `address_reserve` returned, freed only here, once
        // (`gone` guards `drop`), and nothing is mapped in it (the backend checks, and
        // `pages` is empty).
        unsafe { result::address_free(self.va, self.size as usize) }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.gone {
            return;
        }
        let _ = self.ctx.bind();
        // Unmap every page first: the range must be empty before it is freed.
        self.pages.clear();
        // SAFETY: the range is exactly what `address_reserve` returned, not freed before
        // (`gone` is false), and the pages in it were just unmapped.
        if let Err(status) = unsafe { result::address_free(self.va, self.size as usize) } {
            tracing::warn!(
                ?status,
                va = self.va,
                "freeing a CUDA address reservation failed"
            );
        }
    }
}
