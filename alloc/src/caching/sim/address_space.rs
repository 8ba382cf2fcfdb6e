//! The simulated device's address space: live segments, virtual-memory reservations and the
//! pages mapped inside them.
//!
//! Two ordered maps describe it. `ranges` holds every occupied range (a segment from `malloc`
//! or a reservation from `vm_reserve`) keyed by start address; `gaps` holds the complement, the
//! free ranges, coalesced, keyed by start. Both are `BTreeMap`s, so the questions the backend
//! asks are range queries: "which range contains this address" is
//! `range(..=addr).next_back()`, "is `[start, end)` free" is "does the gap containing `start`
//! reach `end`". Placement is first fit in address order (Knuth, TAOCP vol. 1, 2.5,
//! Algorithm A) over the gaps only, so its cost grows with the number of holes, not with the
//! number of segments. Ranges may sit anywhere (replay places segments at recorded addresses
//! in any order); nothing assumes they arrive in address order. A placement at a chosen
//! address (`try_insert_segment`) checks and places with one lookup of the gap containing it,
//! shortening that gap in place; a removal extends the free neighbour below in place.
//!
//! Mapped pages inside a reservation are kept the same way: a coalesced map of mapped ranges,
//! so any granularity-aligned sub-range of a mapping can be unmapped.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use crate::caching::backend::{DeviceError, DevicePtr};

/// The lowest address a range may occupy: address 0 is the null pointer, and the first 512 B
/// (CUDA's minimum alignment) stay unused so no range starts at it.
pub(crate) const ADDRESS_SPACE_FLOOR: u64 = 512;

/// The end (exclusive) of the simulated address space: 2^63, far above any recorded address
/// (user-space pointers on x86-64 and aarch64 stay below 2^48) while leaving room for
/// `start + size` without overflow.
pub(crate) const ADDRESS_SPACE_CEILING: u64 = 1 << 63;

/// What occupies a range.
#[derive(Debug)]
enum Occupant {
    /// A segment from `malloc`, backed by physical memory for its whole size.
    Segment,
    /// A virtual-memory reservation; `mapped` holds its mapped ranges, start -> end, coalesced.
    Reservation { mapped: BTreeMap<u64, u64> },
}

/// One occupied range.
#[derive(Debug)]
struct Occupied {
    end: u64,
    occupant: Occupant,
}

/// The address space of one simulated device.
#[derive(Debug)]
pub(crate) struct AddressSpace {
    /// Occupied ranges, keyed by start address.
    ranges: BTreeMap<u64, Occupied>,
    /// Free ranges, start -> end, coalesced; together with `ranges` they tile
    /// `[ADDRESS_SPACE_FLOOR, ADDRESS_SPACE_CEILING)`.
    gaps: BTreeMap<u64, u64>,
}

/// Rounds `value` up to a multiple of `align` (a power of two), or `None` on overflow.
fn align_up(value: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(value.checked_add(align - 1)? & !(align - 1))
}

impl AddressSpace {
    /// An empty address space.
    pub(crate) fn new() -> AddressSpace {
        let mut gaps = BTreeMap::new();
        gaps.insert(ADDRESS_SPACE_FLOOR, ADDRESS_SPACE_CEILING);
        AddressSpace {
            ranges: BTreeMap::new(),
            gaps,
        }
    }

    /// Whether `[start, start + size)` is entirely free (and inside the address space).
    pub(crate) fn is_free(&self, start: u64, size: u64) -> bool {
        let Some(end) = start.checked_add(size) else {
            return false;
        };
        match self.gaps.range(..=start).next_back() {
            Some((_, &gap_end)) => gap_end >= end,
            None => false,
        }
    }

    /// The lowest `align`-aligned address at or above `base` where `size` bytes are free
    /// (first fit), or `None` if the address space has no such hole.
    pub(crate) fn first_fit(&self, base: u64, size: u64, align: u64) -> Option<u64> {
        let fits = |gap_start: u64, gap_end: u64| -> Option<u64> {
            let start = align_up(gap_start.max(base), align)?;
            (start.checked_add(size)? <= gap_end).then_some(start)
        };
        // The gap that contains `base`, if any, then every gap above it in address order.
        let containing = self
            .gaps
            .range(..=base)
            .next_back()
            .filter(|&(_, &end)| end > base);
        containing
            .into_iter()
            .chain(self.gaps.range(base.saturating_add(1)..))
            .find_map(|(&start, &end)| fits(start, end))
    }

    /// Marks `[start, start + size)` as occupied. The caller has checked it is free.
    fn occupy(&mut self, start: u64, size: u64, occupant: Occupant) {
        let placed = self.try_occupy(start, size, occupant);
        debug_assert!(placed, "occupy: caller checked the range is free");
    }

    /// Marks `[start, start + size)` as occupied if it is entirely free; returns whether it
    /// was. One lookup of the gap containing `start` both checks and places (a hinted
    /// placement costs a range query and the map updates, nothing else). The gap's entry is
    /// updated in place where the range starts inside it rather than at its start, so the
    /// common case (a range at a gap's start or in its middle) touches the map once or twice.
    fn try_occupy(&mut self, start: u64, size: u64, occupant: Occupant) -> bool {
        let Some(end) = start.checked_add(size) else {
            return false;
        };
        let Some((&gap_start, gap_end)) = self.gaps.range_mut(..=start).next_back() else {
            return false;
        };
        let old_end = *gap_end;
        if old_end < end {
            return false;
        }
        if gap_start < start {
            // The gap keeps its front part: shorten it in place.
            *gap_end = start;
        } else {
            self.gaps.remove(&gap_start);
        }
        if end < old_end {
            self.gaps.insert(end, old_end);
        }
        self.ranges.insert(start, Occupied { end, occupant });
        true
    }

    /// Places a segment at `start` if `[start, start + size)` is free; returns whether it
    /// was (and so whether the segment was placed).
    pub(crate) fn try_insert_segment(&mut self, start: u64, size: u64) -> bool {
        self.try_occupy(start, size, Occupant::Segment)
    }

    /// Returns `[start, end)` to the free ranges, merging with free neighbours.
    fn vacate(&mut self, start: u64, end: u64) {
        let new_end = self.gaps.remove(&end).unwrap_or(end);
        // A free neighbour below absorbs the range in place; else the range is a new gap.
        if let Some((_, prev_end)) = self.gaps.range_mut(..start).next_back()
            && *prev_end == start
        {
            *prev_end = new_end;
        } else {
            self.gaps.insert(start, new_end);
        }
    }

    /// Places a segment at `start` (free, checked by the caller).
    pub(crate) fn insert_segment(&mut self, start: u64, size: u64) {
        self.occupy(start, size, Occupant::Segment);
    }

    /// Places a reservation at `start` (free, checked by the caller).
    pub(crate) fn insert_reservation(&mut self, start: u64, size: u64) {
        self.occupy(
            start,
            size,
            Occupant::Reservation {
                mapped: BTreeMap::new(),
            },
        );
    }

    /// Removes the segment that starts at `ptr` and returns its size.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] if no live segment starts at `ptr` (never allocated, already
    /// freed, an interior pointer, or a reservation).
    pub(crate) fn remove_segment(&mut self, ptr: DevicePtr) -> Result<u64, DeviceError> {
        match self.ranges.entry(ptr) {
            Entry::Occupied(range) if matches!(range.get().occupant, Occupant::Segment) => {
                let end = range.remove().end;
                self.vacate(ptr, end);
                Ok(end - ptr)
            }
            Entry::Occupied(_) => Err(DeviceError::Invalid(format!(
                "free({ptr:#x}): this address is a virtual-memory reservation, not a malloc'd \
                 segment (give it back with vm_release)"
            ))),
            Entry::Vacant(_) => Err(DeviceError::Invalid(format!(
                "free({ptr:#x}): no live segment starts at this address (never allocated, an \
                 interior pointer, or a double free)"
            ))),
        }
    }

    /// The mapped ranges of the reservation that contains `[va, va + size)`.
    fn reservation_mut(
        &mut self,
        what: &str,
        va: u64,
        size: u64,
    ) -> Result<&mut BTreeMap<u64, u64>, DeviceError> {
        let end = va
            .checked_add(size)
            .ok_or_else(|| DeviceError::Invalid(format!("{what}({va:#x}, {size}): overflows")))?;
        match self.ranges.range_mut(..=va).next_back() {
            Some((
                _,
                Occupied {
                    end: res_end,
                    occupant: Occupant::Reservation { mapped },
                },
            )) if *res_end >= end => Ok(mapped),
            _ => Err(DeviceError::Invalid(format!(
                "{what}({va:#x}, {size}): the range is not inside one reserved range"
            ))),
        }
    }

    /// Checks that `[va, va + size)` lies inside one reservation and nothing in it is mapped.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] naming the problem.
    pub(crate) fn check_map(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        let mapped = self.reservation_mut("vm_map", va, size)?;
        let end = va + size;
        if let Some((&m_start, &m_end)) = mapped.range(..end).next_back()
            && m_end > va
        {
            return Err(DeviceError::Invalid(format!(
                "vm_map({va:#x}, {size}): overlaps the mapped range [{m_start:#x}, {m_end:#x})"
            )));
        }
        Ok(())
    }

    /// Maps `[va, va + size)`, which [`check_map`](Self::check_map) accepted.
    pub(crate) fn map(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        self.check_map(va, size)?;
        let mapped = self.reservation_mut("vm_map", va, size)?;
        let mut start = va;
        let mut end = va + size;
        if let Some((&prev_start, &prev_end)) = mapped.range(..va).next_back()
            && prev_end == va
        {
            mapped.remove(&prev_start);
            start = prev_start;
        }
        if let Some(next_end) = mapped.remove(&end) {
            end = next_end;
        }
        mapped.insert(start, end);
        Ok(())
    }

    /// Unmaps `[va, va + size)`, which must be entirely mapped.
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] if the range is not inside one reservation or not all mapped.
    pub(crate) fn unmap(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        let mapped = self.reservation_mut("vm_unmap", va, size)?;
        let end = va + size;
        let (m_start, m_end) = match mapped.range(..=va).next_back() {
            Some((&m_start, &m_end)) if m_end >= end => (m_start, m_end),
            _ => {
                return Err(DeviceError::Invalid(format!(
                    "vm_unmap({va:#x}, {size}): the range is not entirely mapped"
                )));
            }
        };
        mapped.remove(&m_start);
        if m_start < va {
            mapped.insert(m_start, va);
        }
        if end < m_end {
            mapped.insert(end, m_end);
        }
        Ok(())
    }

    /// Gives back the reservation `[va, va + size)` (exactly as reserved, nothing mapped).
    ///
    /// # Errors
    /// [`DeviceError::Invalid`] if no reservation starts at `va`, its size differs, or part of it
    /// is still mapped.
    pub(crate) fn release(&mut self, va: u64, size: u64) -> Result<(), DeviceError> {
        match self.ranges.get(&va) {
            Some(Occupied {
                end,
                occupant: Occupant::Reservation { mapped },
            }) => {
                let reserved = end - va;
                if reserved != size {
                    return Err(DeviceError::Invalid(format!(
                        "vm_release({va:#x}, {size}): the reservation at this address is \
                         {reserved} bytes; release it whole"
                    )));
                }
                if let Some((&m_start, &m_end)) = mapped.iter().next() {
                    return Err(DeviceError::Invalid(format!(
                        "vm_release({va:#x}, {size}): [{m_start:#x}, {m_end:#x}) is still \
                         mapped; unmap it first"
                    )));
                }
                let end = *end;
                self.ranges.remove(&va);
                self.vacate(va, end);
                Ok(())
            }
            _ => Err(DeviceError::Invalid(format!(
                "vm_release({va:#x}, {size}): no reservation starts at this address"
            ))),
        }
    }

    /// `(address, size)` of every live segment, in address order.
    pub(crate) fn segments(&self) -> Vec<(u64, u64)> {
        self.ranges
            .iter()
            .filter(|(_, r)| matches!(r.occupant, Occupant::Segment))
            .map(|(&start, r)| (start, r.end - start))
            .collect()
    }

    /// `(address, size)` of every reservation, in address order.
    pub(crate) fn reservations(&self) -> Vec<(u64, u64)> {
        self.ranges
            .iter()
            .filter(|(_, r)| matches!(r.occupant, Occupant::Reservation { .. }))
            .map(|(&start, r)| (start, r.end - start))
            .collect()
    }

    /// `(address, size)` of every mapped range (coalesced), in address order.
    pub(crate) fn mapped_ranges(&self) -> Vec<(u64, u64)> {
        self.ranges
            .values()
            .filter_map(|r| match &r.occupant {
                Occupant::Reservation { mapped } => Some(mapped),
                Occupant::Segment => None,
            })
            .flat_map(|mapped| mapped.iter().map(|(&s, &e)| (s, e - s)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn gaps_and_ranges_tile_the_space_after_random_placements_and_removals() {
        let mut space = AddressSpace::new();
        let mut live = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for step in 0..2000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            if step % 3 == 2 && !live.is_empty() {
                let idx = (seed as usize) % live.len();
                let ptr: u64 = live.swap_remove(idx);
                space.remove_segment(ptr).unwrap();
            } else {
                let size = (seed % 8 + 1) * 2 * MIB;
                let start = space.first_fit(1 << 40, size, 2 * MIB).unwrap();
                assert!(space.is_free(start, size));
                space.insert_segment(start, size);
                live.push(start);
            }
            // Tiling: walk ranges and gaps together.
            let mut cursor = ADDRESS_SPACE_FLOOR;
            let mut items: Vec<(u64, u64)> = space
                .ranges
                .iter()
                .map(|(&s, r)| (s, r.end))
                .chain(space.gaps.iter().map(|(&s, &e)| (s, e)))
                .collect();
            items.sort_unstable();
            for (s, e) in items {
                assert_eq!(s, cursor);
                assert!(e > s);
                cursor = e;
            }
            assert_eq!(cursor, ADDRESS_SPACE_CEILING);
            // Gaps are coalesced: no two gaps touch.
            let gaps: Vec<_> = space.gaps.iter().collect();
            for pair in gaps.windows(2) {
                assert!(pair[0].1 < pair[1].0);
            }
        }
    }
}
