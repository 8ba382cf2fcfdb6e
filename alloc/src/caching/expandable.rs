//! Expandable segments (PyTorch's `ExpandableSegment`, Note [Expandable Segments]).
//!
//! One virtual range per (stream, pool), reserved for 1.125 x the device's total memory, mapped
//! page by page (2 MiB pages for the small pool, 20 MiB for the large) as requests need more.
//! `map` backs the pages covering a range; `unmap` releases the whole pages inside a range.

use crate::caching::backend::{DeviceBackend, DeviceError};

/// Address space reserved per segment: total memory times 9/8 (numerator, denominator).
pub const ADDRESS_SPACE_FACTOR: (u64, u64) = (9, 8);

/// One expandable segment: a reserved virtual range and which of its pages are mapped.
#[derive(Debug)]
pub(crate) struct ExpandableSegment {
    /// Start of the reserved range.
    pub va: u64,
    /// Page (mapping unit) size.
    pub page: u64,
    /// Pages the range can hold.
    pub max_pages: u64,
    /// Mapped state per page, trimmed after the last mapped page.
    mapped: Vec<bool>,
}

impl ExpandableSegment {
    /// Reserves the address space: enough pages for `total_memory * 9 / 8`.
    pub(crate) fn reserve<B: DeviceBackend>(
        backend: &B,
        total_memory: u64,
        page: u64,
    ) -> Result<ExpandableSegment, DeviceError> {
        let want = total_memory.saturating_add(
            total_memory / ADDRESS_SPACE_FACTOR.1
                * (ADDRESS_SPACE_FACTOR.0 - ADDRESS_SPACE_FACTOR.1),
        );
        let max_pages = want.div_ceil(page).max(1);
        let va = backend.vm_reserve(max_pages * page)?;
        Ok(ExpandableSegment {
            va,
            page,
            max_pages,
            mapped: Vec::new(),
        })
    }

    /// Whether no page is mapped.
    pub(crate) fn is_unmapped(&self) -> bool {
        self.mapped.is_empty()
    }

    /// Size of the reserved range.
    pub(crate) fn size(&self) -> u64 {
        self.max_pages * self.page
    }

    /// Maps the pages covering `[ptr, ptr + size)` (`ptr` page-aligned). Returns the range
    /// mapped, of size 0 when the device is out of memory (pages mapped by this call are
    /// released again).
    pub(crate) fn map<B: DeviceBackend>(
        &mut self,
        backend: &B,
        ptr: u64,
        size: u64,
    ) -> Result<(u64, u64), DeviceError> {
        let begin = (ptr - self.va) / self.page;
        let end = (ptr + size - self.va).div_ceil(self.page);
        let start = self.va + begin * self.page;
        if begin >= end {
            return Ok((start, 0));
        }
        if self.mapped.len() < end as usize {
            self.mapped.resize(end as usize, false);
        }
        for i in begin..end {
            match backend.vm_map(self.va + i * self.page, self.page) {
                Ok(()) => self.mapped[i as usize] = true,
                Err(e) => {
                    for j in begin..i {
                        backend.vm_unmap(self.va + j * self.page, self.page)?;
                        self.mapped[j as usize] = false;
                    }
                    self.trim();
                    return if e.is_out_of_memory() {
                        Ok((start, 0))
                    } else {
                        Err(e)
                    };
                }
            }
        }
        Ok((start, (end - begin) * self.page))
    }

    /// Unmaps the whole pages inside `[ptr, ptr + size)`; returns the range unmapped (size 0
    /// when no whole page lies inside). Waits for the device first, as PyTorch does (unmapping
    /// does not synchronize by itself).
    pub(crate) fn unmap<B: DeviceBackend>(
        &mut self,
        backend: &B,
        ptr: u64,
        size: u64,
    ) -> Result<(u64, u64), DeviceError> {
        let begin = (ptr - self.va).div_ceil(self.page);
        let end = (ptr + size - self.va) / self.page;
        if begin >= end {
            return Ok((ptr, 0));
        }
        backend.synchronize_device()?;
        for i in begin..end {
            backend.vm_unmap(self.va + i * self.page, self.page)?;
            self.mapped[i as usize] = false;
        }
        self.trim();
        Ok((self.va + begin * self.page, (end - begin) * self.page))
    }

    fn trim(&mut self) {
        while self.mapped.last() == Some(&false) {
            self.mapped.pop();
        }
    }
}
