//! What a caller wants from an allocator ([`AllocatorAttributes`]) and from one allocation
//! ([`AllocationAttributes`]), as TensorFlow's `allocator.h`.
//!
//! The two are easy to confuse: `AllocatorAttributes` are given to a device to pick a suitable
//! allocator (host memory that a GPU can DMA from, memory a NIC can use), while
//! `AllocationAttributes` travel with one `allocate_raw` call.

/// Bit of [`AllocatorAttributes::value`]: memory on the host (CPU) side.
pub const ON_HOST: u32 = 1 << 0;
/// Bit: memory a network interface can use for DMA.
pub const NIC_COMPATIBLE: u32 = 1 << 1;
/// Bit: host memory a GPU can use (pinned, for DMA).
pub const GPU_COMPATIBLE: u32 = 1 << 2;
/// Bit: the allocator should track allocation sizes.
pub const TRACK_SIZES: u32 = 1 << 3;
/// Number of low bits reserved before the device-specific byte.
pub const DEVICE_SPECIFIC_SHIFT: u32 = 24;
/// The top 8 bits of [`AllocatorAttributes::value`]: reserved for the device, which interprets
/// them as it needs (TensorFlow reserves them the same way).
pub const DEVICE_SPECIFIC_MASK: u32 = 0xff << DEVICE_SPECIFIC_SHIFT;

/// The kind of memory asked of a device (TensorFlow's `AllocatorAttributes`): a set of flags in
/// one `u32`, the top 8 bits of which are device-specific.
///
/// # Examples
///
/// ```
/// use allocview_alloc::attributes::AllocatorAttributes;
///
/// let host = AllocatorAttributes::new().with_on_host(true);
/// let pinned = host.with_gpu_compatible(true);
/// assert!(host.is_equal_or_less_restrictive_than(pinned));
/// assert!(!pinned.is_equal_or_less_restrictive_than(host));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AllocatorAttributes {
    /// The raw bits: [`ON_HOST`], [`NIC_COMPATIBLE`], [`GPU_COMPATIBLE`], [`TRACK_SIZES`], and
    /// the device-specific byte under [`DEVICE_SPECIFIC_MASK`].
    pub value: u32,
}

impl AllocatorAttributes {
    /// No flags set: device memory, nothing special.
    pub const fn new() -> AllocatorAttributes {
        AllocatorAttributes { value: 0 }
    }

    /// Attributes from raw bits.
    pub const fn from_bits(value: u32) -> AllocatorAttributes {
        AllocatorAttributes { value }
    }

    const fn flag(self, bit: u32) -> bool {
        self.value & bit != 0
    }

    const fn with_flag(self, bit: u32, on: bool) -> AllocatorAttributes {
        let value = if on {
            self.value | bit
        } else {
            self.value & !bit
        };
        AllocatorAttributes { value }
    }

    /// Whether host (CPU) memory is wanted.
    pub const fn on_host(self) -> bool {
        self.flag(ON_HOST)
    }

    /// Sets or clears [`ON_HOST`].
    pub fn set_on_host(&mut self, on: bool) {
        *self = self.with_on_host(on);
    }

    /// A copy with [`ON_HOST`] set or cleared.
    pub const fn with_on_host(self, on: bool) -> AllocatorAttributes {
        self.with_flag(ON_HOST, on)
    }

    /// Whether a NIC must be able to use the memory.
    pub const fn nic_compatible(self) -> bool {
        self.flag(NIC_COMPATIBLE)
    }

    /// Sets or clears [`NIC_COMPATIBLE`].
    pub fn set_nic_compatible(&mut self, on: bool) {
        *self = self.with_nic_compatible(on);
    }

    /// A copy with [`NIC_COMPATIBLE`] set or cleared.
    pub const fn with_nic_compatible(self, on: bool) -> AllocatorAttributes {
        self.with_flag(NIC_COMPATIBLE, on)
    }

    /// Whether a GPU must be able to use the (host) memory.
    pub const fn gpu_compatible(self) -> bool {
        self.flag(GPU_COMPATIBLE)
    }

    /// Sets or clears [`GPU_COMPATIBLE`].
    pub fn set_gpu_compatible(&mut self, on: bool) {
        *self = self.with_gpu_compatible(on);
    }

    /// A copy with [`GPU_COMPATIBLE`] set or cleared.
    pub const fn with_gpu_compatible(self, on: bool) -> AllocatorAttributes {
        self.with_flag(GPU_COMPATIBLE, on)
    }

    /// Whether the allocator should track allocation sizes.
    pub const fn track_sizes(self) -> bool {
        self.flag(TRACK_SIZES)
    }

    /// Sets or clears [`TRACK_SIZES`].
    pub fn set_track_sizes(&mut self, on: bool) {
        *self = self.with_track_sizes(on);
    }

    /// A copy with [`TRACK_SIZES`] set or cleared.
    pub const fn with_track_sizes(self, on: bool) -> AllocatorAttributes {
        self.with_flag(TRACK_SIZES, on)
    }

    /// The device-specific byte (the top 8 bits of `value`).
    pub const fn device_specific(self) -> u8 {
        (self.value >> DEVICE_SPECIFIC_SHIFT) as u8
    }

    /// Replaces the device-specific byte, leaving the other bits alone.
    pub fn set_device_specific(&mut self, bits: u8) {
        *self = self.with_device_specific(bits);
    }

    /// A copy with the device-specific byte replaced.
    pub const fn with_device_specific(self, bits: u8) -> AllocatorAttributes {
        let value = (self.value & !DEVICE_SPECIFIC_MASK) | ((bits as u32) << DEVICE_SPECIFIC_SHIFT);
        AllocatorAttributes { value }
    }

    /// Adds every requirement of `other` to these (TensorFlow's `Merge`: a bitwise or, the
    /// device-specific byte included).
    pub fn merge(&mut self, other: AllocatorAttributes) {
        self.value |= other.value;
    }

    /// `self` with `other`'s requirements added, by value.
    pub const fn merged(self, other: AllocatorAttributes) -> AllocatorAttributes {
        AllocatorAttributes {
            value: self.value | other.value,
        }
    }

    /// Whether memory satisfying `other` also satisfies `self`: every bit set here is set in
    /// `other` (TensorFlow's `IsEqualOrLessRestrictiveThan`: `(value | other) == other`).
    pub const fn is_equal_or_less_restrictive_than(self, other: AllocatorAttributes) -> bool {
        (self.value | other.value) == other.value
    }
}

/// Options for one allocation (TensorFlow's `AllocationAttributes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AllocationAttributes {
    /// Fail at once if the first attempt fails, rather than retrying (after freeing caches, or
    /// waiting for memory to come back).
    pub no_retry_on_failure: bool,
    /// The caller will log this allocation itself, so the allocator need not.
    pub allocation_will_be_logged: bool,
}

impl AllocationAttributes {
    /// Both options off (retry on failure, not logged by the caller).
    pub const fn new() -> AllocationAttributes {
        AllocationAttributes {
            no_retry_on_failure: false,
            allocation_will_be_logged: false,
        }
    }
}
