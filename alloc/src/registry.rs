//! [`AllocatorRegistry`]: allocators registered by name and priority, the highest priority
//! answering [`get`](AllocatorRegistry::get) (TensorFlow's `AllocatorRegistry` in
//! `allocator_registry.h`, where `REGISTER_MEM_ALLOCATOR` fills a process-wide singleton).
//!
//! There is a process-wide registry ([`AllocatorRegistry::global`]) and plain instances
//! ([`AllocatorRegistry::new`]) for code and tests that want their own.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::allocator::Allocator;

/// Why a registration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// An allocator with this name and priority is already registered.
    #[error("an allocator named {name:?} with priority {priority} is already registered")]
    Duplicate {
        /// The name.
        name: String,
        /// The priority.
        priority: i32,
    },
    /// The name is empty (or only white space): the registry's entries are told apart and
    /// reported by name.
    #[error("an allocator's name must not be empty (priority {priority})")]
    EmptyName {
        /// The priority it was to have.
        priority: i32,
    },
}

/// One registered allocator.
struct Entry {
    name: String,
    priority: i32,
    allocator: Arc<dyn Allocator>,
}

/// Allocators by name and priority (thread-safe).
///
/// [`get`](AllocatorRegistry::get) returns the allocator with the highest priority; among
/// equal priorities, the one registered first.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use allocview_alloc::cpu::CpuAllocator;
/// use allocview_alloc::registry::AllocatorRegistry;
///
/// let registry = AllocatorRegistry::new();
/// registry.register("cpu", 100, Arc::new(CpuAllocator::new())).unwrap();
/// registry.register("cpu-limited", 50, Arc::new(CpuAllocator::with_limit(1 << 20))).unwrap();
/// assert_eq!(registry.get_entry().unwrap().0, "cpu");
/// assert!(registry.register("cpu", 100, Arc::new(CpuAllocator::new())).is_err());
/// ```
#[derive(Default)]
pub struct AllocatorRegistry {
    entries: RwLock<Vec<Entry>>,
}

impl std::fmt::Debug for AllocatorRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.entries()).finish()
    }
}

impl AllocatorRegistry {
    /// An empty registry.
    pub const fn new() -> AllocatorRegistry {
        AllocatorRegistry {
            entries: RwLock::new(Vec::new()),
        }
    }

    /// The process-wide registry (empty until something registers).
    pub fn global() -> &'static AllocatorRegistry {
        static GLOBAL: AllocatorRegistry = AllocatorRegistry::new();
        &GLOBAL
    }

    fn read(&self) -> RwLockReadGuard<'_, Vec<Entry>> {
        // A panic while holding the lock cannot leave the vector half-updated (pushes are
        // atomic from the reader's view), so a poisoned lock is still good.
        self.entries
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Vec<Entry>> {
        self.entries
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers `allocator` under `name` and `priority`.
    ///
    /// # Errors
    ///
    /// [`RegistryError::Duplicate`] if that name and priority are already taken,
    /// [`RegistryError::EmptyName`] if `name` is empty or white space.
    pub fn register(
        &self,
        name: impl Into<String>,
        priority: i32,
        allocator: Arc<dyn Allocator>,
    ) -> Result<(), RegistryError> {
        let name = name.into();
        if name.trim().is_empty() {
            return Err(RegistryError::EmptyName { priority });
        }
        let mut entries = self.write();
        if entries
            .iter()
            .any(|e| e.name == name && e.priority == priority)
        {
            return Err(RegistryError::Duplicate { name, priority });
        }
        entries.push(Entry {
            name,
            priority,
            allocator,
        });
        Ok(())
    }

    /// The allocator with the highest priority (the first registered among equals), if any.
    pub fn get(&self) -> Option<Arc<dyn Allocator>> {
        self.get_entry().map(|(_, _, allocator)| allocator)
    }

    /// [`get`](AllocatorRegistry::get) with the winner's name and priority.
    pub fn get_entry(&self) -> Option<(String, i32, Arc<dyn Allocator>)> {
        let entries = self.read();
        let mut best: Option<&Entry> = None;
        for entry in entries.iter() {
            // Strictly greater: among equal priorities the earlier registration stays.
            if best.is_none_or(|b| entry.priority > b.priority) {
                best = Some(entry);
            }
        }
        best.map(|e| (e.name.clone(), e.priority, Arc::clone(&e.allocator)))
    }

    /// The allocator registered under exactly this name and priority.
    pub fn get_registered(&self, name: &str, priority: i32) -> Option<Arc<dyn Allocator>> {
        self.read()
            .iter()
            .find(|e| e.name == name && e.priority == priority)
            .map(|e| Arc::clone(&e.allocator))
    }

    /// Names and priorities of everything registered, in registration order.
    pub fn entries(&self) -> Vec<(String, i32)> {
        self.read()
            .iter()
            .map(|e| (e.name.clone(), e.priority))
            .collect()
    }

    /// Number of registered allocators.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }
}
