//! `AllocatorRegistry`: priority order, ties, duplicates, lookup, the process-wide instance.

use std::sync::Arc;

use allocview_alloc::allocator::Allocator;
use allocview_alloc::cpu::CpuAllocator;
use allocview_alloc::registry::{AllocatorRegistry, RegistryError};

fn cpu() -> Arc<dyn Allocator> {
    Arc::new(CpuAllocator::new())
}

fn same(a: &Arc<dyn Allocator>, b: &Arc<dyn Allocator>) -> bool {
    Arc::ptr_eq(a, b)
}

#[test]
fn an_empty_registry_has_no_allocator() {
    let r = AllocatorRegistry::new();
    assert!(r.get().is_none());
    assert!(r.is_empty());
}

#[test]
fn the_highest_priority_wins_whatever_the_order_of_registration() {
    let r = AllocatorRegistry::new();
    let (low, high, mid) = (cpu(), cpu(), cpu());
    r.register("low", 10, low.clone()).unwrap();
    r.register("high", 300, high.clone()).unwrap();
    r.register("mid", 200, mid.clone()).unwrap();
    assert!(same(&r.get().unwrap(), &high));
    assert_eq!(r.get_entry().unwrap().0, "high");
    assert_eq!(r.len(), 3);
}

#[test]
fn negative_priorities_rank_below_zero() {
    let r = AllocatorRegistry::new();
    let neg = cpu();
    let zero = cpu();
    r.register("neg", -5, neg).unwrap();
    r.register("zero", 0, zero.clone()).unwrap();
    assert!(same(&r.get().unwrap(), &zero));
}

#[test]
fn among_equal_priorities_the_first_registered_wins() {
    let r = AllocatorRegistry::new();
    let first = cpu();
    r.register("first", 100, first.clone()).unwrap();
    r.register("second", 100, cpu()).unwrap();
    r.register("third", 100, cpu()).unwrap();
    assert!(same(&r.get().unwrap(), &first));
}

#[test]
fn registering_the_same_name_and_priority_twice_is_an_error() {
    let r = AllocatorRegistry::new();
    r.register("cpu", 100, cpu()).unwrap();
    let err = r.register("cpu", 100, cpu()).unwrap_err();
    assert_eq!(
        err,
        RegistryError::Duplicate {
            name: "cpu".into(),
            priority: 100
        }
    );
    assert!(err.to_string().contains("\"cpu\""));
    // The same name at another priority, or another name at the same priority, is fine.
    r.register("cpu", 50, cpu()).unwrap();
    r.register("other", 100, cpu()).unwrap();
    assert_eq!(
        r.entries(),
        vec![
            ("cpu".into(), 100),
            ("cpu".into(), 50),
            ("other".into(), 100)
        ]
    );
}

#[test]
fn lookup_by_name_and_priority_finds_exactly_that_entry() {
    let r = AllocatorRegistry::new();
    let a = cpu();
    let b = cpu();
    r.register("cpu", 100, a.clone()).unwrap();
    r.register("cpu", 50, b.clone()).unwrap();
    assert!(same(&r.get_registered("cpu", 100).unwrap(), &a));
    assert!(same(&r.get_registered("cpu", 50).unwrap(), &b));
    assert!(r.get_registered("cpu", 75).is_none());
    assert!(r.get_registered("gpu", 100).is_none());
}

#[test]
fn the_global_registry_is_one_instance_shared_across_threads() {
    let a = cpu();
    let name = "registry-test-global";
    std::thread::scope(|s| {
        s.spawn(|| {
            AllocatorRegistry::global()
                .register(name, i32::MAX, a.clone())
                .unwrap()
        });
    });
    assert!(same(&AllocatorRegistry::global().get().unwrap(), &a));
    assert!(same(
        &AllocatorRegistry::global()
            .get_registered(name, i32::MAX)
            .unwrap(),
        &a
    ));
}

#[test]
fn concurrent_registrations_all_land() {
    let r = AllocatorRegistry::new();
    std::thread::scope(|s| {
        for t in 0..4 {
            let r = &r;
            s.spawn(move || {
                for p in 0..25 {
                    r.register(format!("t{t}"), p, cpu()).unwrap();
                }
            });
        }
    });
    assert_eq!(r.len(), 100);
    assert_eq!(r.get_entry().unwrap().1, 24);
}

#[test]
fn an_empty_or_blank_name_is_refused() {
    let r = AllocatorRegistry::new();
    for name in ["", "  "] {
        let err = r.register(name, 3, cpu()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "an allocator's name must not be empty (priority 3)"
        );
    }
    assert_eq!(r.len(), 0);
}
