//! `AllocatorAttributes` and `AllocationAttributes`: flags, merge, restrictiveness, the
//! device-specific byte.

use allocview_alloc::attributes::{
    AllocationAttributes, AllocatorAttributes, DEVICE_SPECIFIC_MASK, GPU_COMPATIBLE,
    NIC_COMPATIBLE, ON_HOST, TRACK_SIZES,
};

#[test]
fn each_flag_sets_and_clears_its_own_bit() {
    let mut a = AllocatorAttributes::new();
    a.set_on_host(true);
    assert_eq!(a.value, ON_HOST);
    a.set_nic_compatible(true);
    a.set_gpu_compatible(true);
    a.set_track_sizes(true);
    assert_eq!(
        a.value,
        ON_HOST | NIC_COMPATIBLE | GPU_COMPATIBLE | TRACK_SIZES
    );
    assert!(a.on_host() && a.nic_compatible() && a.gpu_compatible() && a.track_sizes());
    a.set_nic_compatible(false);
    assert!(!a.nic_compatible());
    assert_eq!(a.value, ON_HOST | GPU_COMPATIBLE | TRACK_SIZES);
}

#[test]
fn the_bits_follow_tensorflows_layout() {
    assert_eq!(AllocatorAttributes::new().with_on_host(true).value, 1);
    assert_eq!(
        AllocatorAttributes::new().with_nic_compatible(true).value,
        2
    );
    assert_eq!(
        AllocatorAttributes::new().with_gpu_compatible(true).value,
        4
    );
}

#[test]
fn the_top_eight_bits_are_device_specific_and_independent_of_the_flags() {
    let mut a = AllocatorAttributes::new().with_on_host(true);
    a.set_device_specific(0xAB);
    assert_eq!(a.device_specific(), 0xAB);
    assert_eq!(a.value, 0xAB00_0001);
    assert!(a.on_host());
    a.set_device_specific(0x01);
    assert_eq!(a.value & DEVICE_SPECIFIC_MASK, 0x0100_0000);
    assert!(a.on_host());
    assert_eq!(
        AllocatorAttributes::from_bits(u32::MAX).device_specific(),
        0xFF
    );
    assert_eq!(
        AllocatorAttributes::from_bits(0x00FF_FFFF).device_specific(),
        0
    );
}

#[test]
fn merge_adds_the_other_requirements_including_device_bits() {
    let mut a = AllocatorAttributes::new()
        .with_on_host(true)
        .with_device_specific(0x10);
    let b = AllocatorAttributes::new()
        .with_gpu_compatible(true)
        .with_device_specific(0x01);
    a.merge(b);
    assert!(a.on_host() && a.gpu_compatible() && !a.nic_compatible());
    assert_eq!(a.device_specific(), 0x11);
    assert_eq!(
        AllocatorAttributes::new().with_on_host(true).merged(b),
        a.with_device_specific(0x01)
    );
    let before = a;
    a.merge(AllocatorAttributes::new());
    assert_eq!(a, before, "merging nothing changes nothing");
}

#[test]
fn restrictiveness_is_the_subset_relation_on_bits() {
    let none = AllocatorAttributes::new();
    let host = none.with_on_host(true);
    let pinned = host.with_gpu_compatible(true);
    let nic = none.with_nic_compatible(true);
    assert!(none.is_equal_or_less_restrictive_than(host));
    assert!(host.is_equal_or_less_restrictive_than(host));
    assert!(host.is_equal_or_less_restrictive_than(pinned));
    assert!(!pinned.is_equal_or_less_restrictive_than(host));
    assert!(!nic.is_equal_or_less_restrictive_than(pinned));
    assert!(!pinned.is_equal_or_less_restrictive_than(nic));
    let dev = host.with_device_specific(0x80);
    assert!(host.is_equal_or_less_restrictive_than(dev));
    assert!(!dev.is_equal_or_less_restrictive_than(host));
}

#[test]
fn allocation_attributes_default_to_retrying_and_unlogged() {
    let a = AllocationAttributes::default();
    assert_eq!(a, AllocationAttributes::new());
    assert!(!a.no_retry_on_failure && !a.allocation_will_be_logged);
    let b = AllocationAttributes {
        no_retry_on_failure: true,
        ..a
    };
    assert_ne!(a, b);
}
