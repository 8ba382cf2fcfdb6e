//! `StateLock`: the caching allocator's one mutex, with an unlock that is a plain store.
//!
//! A `std::sync::Mutex` pays two atomic read-modify-writes per critical section (a
//! compare-exchange to lock, a swap to unlock, so the unlocker learns whether anyone sleeps).
//! The caching allocator takes its lock twice per malloc/free pair, so on x86 those four locked
//! instructions were a quarter of the cached path. Here the lock is still a compare-exchange,
//! but the unlock is a release store followed by a plain load of a sleeper count: the
//! asymmetric Dekker pattern of `membarrier(2)` (Linux 4.14+). A thread about to sleep
//! registers in the count and then issues `MEMBARRIER_CMD_PRIVATE_EXPEDITED`, which runs a full
//! memory barrier on every CPU running one of the process's threads; so either the unlocker's
//! store is visible to the sleeper's `futex` check (it does not sleep), or the unlocker's
//! load comes after the barrier and sees the sleeper (it wakes it). Only a thread that has
//! spun without getting the lock pays for the barrier.
//!
//! Where `membarrier` is unavailable (other kernels, valgrind, seccomp filters) the lock falls
//! back to a sequentially consistent swap in the unlock, the classic futex mutex. Off Linux,
//! waiters spin and yield instead of sleeping on a futex.
//!
//! # Biased to the first thread
//! Most programs allocate device memory from one thread. The first thread to take the lock
//! (where `membarrier` works) becomes its *owner* and from then on enters with a plain store
//! and a load, no read-modify-write at all: it marks itself inside, and checks that the bias
//! still stands. The first other thread to take the lock revokes the bias for good: it takes
//! the lock word, marks the bias revoked, issues the process-wide barrier and waits until the
//! owner is not inside; the owner's check then sees the revocation (it backs out and uses the
//! lock word like everyone else) or the revoker sees the owner inside (and waits). That is the
//! same asymmetric pattern as the unlock, and it costs one barrier per lock lifetime.
//!
//! Unlike `std`'s mutex it is never poisoned: the allocator keeps its state consistent or
//! reports the error itself, as it did when it ignored `std`'s poisoning.

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, compiler_fence};

/// Free.
const UNLOCKED: u32 = 0;
/// Held.
const LOCKED: u32 = 1;
/// Tries (each a load, and a compare-exchange when free) before a waiter sleeps.
const SPIN_LIMIT: u32 = 100;
/// `owner`: no thread has taken the bias yet.
const NO_OWNER: u64 = 0;
/// `owner`: the bias was revoked (or never possible); everyone uses the lock word.
const REVOKED: u64 = u64::MAX;

/// A number for the calling thread, unique for the life of the process (never 0).
#[inline]
fn thread_key() -> u64 {
    thread_local! {
        static KEY: Cell<u64> = const { Cell::new(NO_OWNER) };
    }
    static NEXT: AtomicU64 = AtomicU64::new(1);
    KEY.with(|k| {
        let key = k.get();
        if key != NO_OWNER {
            return key;
        }
        let key = NEXT.fetch_add(1, Ordering::Relaxed);
        k.set(key);
        key
    })
}

/// A mutex around `T` whose unlock is a store (see the module docs).
pub(crate) struct StateLock<T> {
    word: AtomicU32,
    sleepers: AtomicU32,
    /// The biased owner's [`thread_key`], [`NO_OWNER`] or [`REVOKED`].
    owner: AtomicU64,
    /// 1 while the owner is inside through the biased path.
    owner_inside: AtomicU32,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&mut T` to one thread at a time, so sharing the lock between
// threads is as safe as sending `T` between them. Two doors admit a thread: the word's
// compare-exchange from UNLOCKED to LOCKED, which succeeds for one thread until the guard's
// release store; and the bias, which admits only the owner, and only while no thread has
// passed the word since the bias was taken (the first that does revokes the bias and waits,
// with the membarrier pairing of the module docs, until the owner is out; the owner re-checks
// the bias after marking itself inside, so it never enters after a revocation it missed).
// The word and the bias together admit one thread: the owner never holds the word while
// inside through the bias, and a word holder that finds the bias live revokes it first.
unsafe impl<T: Send> Sync for StateLock<T> {}

/// Exclusive access to the locked value; unlocks when dropped.
pub(crate) struct StateGuard<'a, T> {
    lock: &'a StateLock<T>,
    /// Entered through the bias (leave by clearing `owner_inside`), not the lock word.
    biased: bool,
}

impl<T> StateLock<T> {
    /// A free lock around `data`.
    pub(crate) fn new(data: T) -> StateLock<T> {
        StateLock {
            word: AtomicU32::new(UNLOCKED),
            sleepers: AtomicU32::new(0),
            owner: AtomicU64::new(NO_OWNER),
            owner_inside: AtomicU32::new(0),
            data: UnsafeCell::new(data),
        }
    }

    /// Takes the lock, waiting for it (spinning briefly, then sleeping).
    #[inline]
    pub(crate) fn lock(&self) -> StateGuard<'_, T> {
        let me = thread_key();
        if self.owner.load(Ordering::Relaxed) == me {
            self.owner_inside.store(1, Ordering::Relaxed);
            // The revoker's barrier pairs with this store-then-load (see the module docs).
            compiler_fence(Ordering::SeqCst);
            if self.owner.load(Ordering::Relaxed) == me {
                return StateGuard {
                    lock: self,
                    biased: true,
                };
            }
            self.owner_inside.store(0, Ordering::Release);
        }
        if self
            .word
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        if self.owner.load(Ordering::Relaxed) != REVOKED {
            self.settle_bias(me);
        }
        StateGuard {
            lock: self,
            biased: false,
        }
    }

    /// Takes the lock if that needs no waiting: `None` when another thread holds it, or is
    /// inside through the bias (which this revokes for good, as [`lock`](Self::lock) would).
    /// Never takes the bias itself, so an occasional caller (the agent's aggregator) leaves it
    /// to the thread that allocates.
    pub(crate) fn try_lock(&self) -> Option<StateGuard<'_, T>> {
        let me = thread_key();
        if self.owner.load(Ordering::Relaxed) == me {
            return Some(self.lock());
        }
        self.word
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        let guard = StateGuard {
            lock: self,
            biased: false,
        };
        let owner = self.owner.load(Ordering::Relaxed);
        if owner == NO_OWNER || owner == REVOKED {
            return Some(guard);
        }
        self.revoke_bias();
        if self.owner_inside.load(Ordering::Acquire) != 0 {
            // The owner is inside: it finishes its call under the bias, and its next call
            // takes the word (dropping the guard releases it).
            return None;
        }
        Some(guard)
    }

    /// With the lock word held: ends the owner's bias and makes its `owner_inside` store
    /// visible here (the barrier), so that `owner_inside` can be trusted afterwards.
    fn revoke_bias(&self) {
        self.owner.store(REVOKED, Ordering::Relaxed);
        if !membarrier::private_expedited() {
            // Cannot happen after a successful registration; should it, give the owner's
            // store buffer far longer than it needs to drain before trusting `owner_inside`.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// With the lock word held: takes the bias when nobody has it (and the barrier works),
    /// or revokes another thread's bias and waits until that thread is out.
    #[cold]
    fn settle_bias(&self, me: u64) {
        let owner = self.owner.load(Ordering::Relaxed);
        if owner == NO_OWNER {
            let next = if fast_unlock_available() { me } else { REVOKED };
            self.owner.store(next, Ordering::Relaxed);
            return;
        }
        if owner == me || owner == REVOKED {
            return;
        }
        self.revoke_bias();
        let mut spins = 0u32;
        while self.owner_inside.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < SPIN_LIMIT {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The value, through exclusive access to the lock.
    pub(crate) fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0;
        loop {
            if self.word.load(Ordering::Relaxed) == UNLOCKED
                && self
                    .word
                    .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            if spins < SPIN_LIMIT {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            // Pairs with the unlocker's store-then-load (see the module docs).
            let fast = heavy_barrier();
            let got = self
                .word
                .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
                .is_ok();
            if !got {
                wait_while_locked(&self.word, fast);
            }
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
            if got {
                return;
            }
        }
    }

    #[inline]
    fn unlock(&self) {
        if fast_unlock_available() {
            self.word.store(UNLOCKED, Ordering::Release);
            // Keeps the compiler from moving the load above the store; the CPU may, and the
            // sleeper's membarrier makes up for it.
            compiler_fence(Ordering::SeqCst);
            if self.sleepers.load(Ordering::Relaxed) != 0 {
                wake_one(&self.word);
            }
        } else {
            self.word.swap(UNLOCKED, Ordering::SeqCst);
            if self.sleepers.load(Ordering::SeqCst) != 0 {
                wake_one(&self.word);
            }
        }
    }
}

impl<T> Deref for StateGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while this thread holds the lock (`lock` returned it
        // after winning the compare-exchange; `drop` releases it), so no other reference to
        // the value is live.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for StateGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the guard's only borrow.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for StateGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if self.biased {
            self.lock.owner_inside.store(0, Ordering::Release);
        } else {
            self.lock.unlock();
        }
    }
}

/// Whether unlocks may use the plain store (decided once per process).
#[inline]
fn fast_unlock_available() -> bool {
    static FAST: OnceLock<bool> = OnceLock::new();
    *FAST.get_or_init(membarrier::register)
}

/// A sleeper's side of the pattern: the process-wide barrier when unlocks are plain stores
/// (returns true), nothing otherwise (the sequentially consistent swap orders them).
fn heavy_barrier() -> bool {
    fast_unlock_available() && membarrier::private_expedited()
}

#[cfg(target_os = "linux")]
mod membarrier {
    //! `membarrier(2)` through `libc::syscall` (the `libc` crate has no wrapper).

    /// `MEMBARRIER_CMD_QUERY`.
    const QUERY: libc::c_long = 0;
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`.
    const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    /// `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`.
    const REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    fn call(cmd: libc::c_long) -> libc::c_long {
        // SAFETY: membarrier takes (cmd, flags, cpu_id) integers and touches no memory of
        // ours; an unknown command or a kernel without it returns -1 with errno set.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_long,
                0 as libc::c_long,
            )
        }
    }

    /// Registers the process for private expedited barriers; false when the kernel (or a
    /// sandbox, or valgrind) does not offer them.
    pub(super) fn register() -> bool {
        let supported = call(QUERY);
        supported >= 0
            && supported & PRIVATE_EXPEDITED != 0
            && call(REGISTER_PRIVATE_EXPEDITED) == 0
            && call(PRIVATE_EXPEDITED) == 0
    }

    /// A full barrier on every CPU running a thread of this process; false if it failed.
    /// A child of `fork` starts unregistered (registration belongs to the address space), so
    /// a refused barrier registers once more and retries.
    pub(super) fn private_expedited() -> bool {
        call(PRIVATE_EXPEDITED) == 0
            || (call(REGISTER_PRIVATE_EXPEDITED) == 0 && call(PRIVATE_EXPEDITED) == 0)
    }
}

#[cfg(not(target_os = "linux"))]
mod membarrier {
    //! No `membarrier`: unlocks always use the swap.

    pub(super) fn register() -> bool {
        false
    }

    pub(super) fn private_expedited() -> bool {
        false
    }
}

/// Sleeps while the word reads LOCKED (a futex wait; spurious returns are fine: the caller
/// loops). `barrier_ok` false after a failed barrier: then sleep briefly instead, so a missed
/// wake costs a millisecond rather than a hang.
#[cfg(target_os = "linux")]
fn wait_while_locked(word: &AtomicU32, barrier_ok: bool) {
    /// How long a sleeper waits at most when it could not make its registration visible.
    const SAFETY_NET: libc::timespec = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    let timeout: *const libc::timespec = if barrier_ok || !fast_unlock_available() {
        std::ptr::null()
    } else {
        &SAFETY_NET
    };
    // SAFETY: FUTEX_WAIT reads the u32 at `word` (a live atomic we borrow for the call) and
    // sleeps only while it equals LOCKED; `timeout` is null or points at a static timespec.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            LOCKED,
            timeout,
        );
    }
}

/// Wakes one sleeper.
#[cfg(target_os = "linux")]
fn wake_one(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key; `word` is a live atomic.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            1 as libc::c_int,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn wait_while_locked(word: &AtomicU32, _barrier_ok: bool) {
    while word.load(Ordering::Relaxed) == LOCKED {
        std::thread::yield_now();
    }
}

#[cfg(not(target_os = "linux"))]
fn wake_one(_word: &AtomicU32) {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_taking_turns_lose_no_update() {
        const THREADS: usize = 8;
        const ROUNDS: u64 = 20_000;
        let lock = Arc::new(StateLock::new((0u64, 0u64)));
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for i in 0..ROUNDS {
                        let mut g = lock.lock();
                        // Two fields written apart: a torn critical section would show.
                        g.0 += 1;
                        if i % 64 == 0 {
                            std::thread::yield_now();
                        }
                        g.1 += 1;
                        assert_eq!(g.0, g.1);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let total = THREADS as u64 * ROUNDS;
        assert_eq!(*lock.lock(), (total, total));
    }

    #[test]
    fn the_first_thread_holds_the_bias_until_another_thread_comes() {
        const ROUNDS: u64 = 200_000;
        let lock = Arc::new(StateLock::new((0u64, 0u64)));
        for _ in 0..10 {
            *lock.lock() = (0, 0);
        }
        let biased = fast_unlock_available();
        assert_eq!(lock.owner.load(Ordering::Relaxed) == thread_key(), biased);
        // The owner keeps going through the bias while another thread arrives and revokes it.
        let l2 = Arc::clone(&lock);
        let other = std::thread::spawn(move || {
            for _ in 0..ROUNDS {
                let mut g = l2.lock();
                g.0 += 1;
                g.1 += 1;
            }
        });
        for _ in 0..ROUNDS {
            let mut g = lock.lock();
            g.0 += 1;
            assert_eq!(g.0, g.1 + 1, "another thread was inside at the same time");
            g.1 += 1;
        }
        other.join().unwrap();
        assert_eq!(*lock.lock(), (2 * ROUNDS, 2 * ROUNDS));
        assert_eq!(lock.owner.load(Ordering::Relaxed), REVOKED);
        assert_eq!(lock.owner_inside.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn try_lock_fails_while_held_and_leaves_the_bias_to_the_allocating_thread() {
        let lock = Arc::new(StateLock::new(0u64));
        // Taken by a thread that is not the first: no bias for it.
        let l2 = lock.clone();
        std::thread::spawn(move || *l2.try_lock().unwrap() += 1)
            .join()
            .unwrap();
        assert_eq!(lock.owner.load(Ordering::Relaxed), NO_OWNER);
        {
            let _held = lock.lock();
            let l2 = lock.clone();
            let got = std::thread::spawn(move || l2.try_lock().is_some())
                .join()
                .unwrap();
            assert!(!got, "the lock is held");
        }
        // Free (and biased to this thread, or revoked where membarrier is missing): another
        // thread gets it without waiting, and this thread's next lock still works.
        let l2 = lock.clone();
        std::thread::spawn(move || *l2.try_lock().unwrap() += 1)
            .join()
            .unwrap();
        *lock.lock() += 1;
        assert_eq!(*lock.lock(), 3);
        assert_eq!(lock.owner.load(Ordering::Relaxed), REVOKED);
    }

    #[test]
    fn a_sleeping_waiter_is_woken_by_the_unlock() {
        let lock = Arc::new(StateLock::new(0u32));
        let g = lock.lock();
        let l2 = Arc::clone(&lock);
        let waiter = std::thread::spawn(move || {
            *l2.lock() += 1;
        });
        // Long enough for the waiter to pass its spins and sleep on the futex.
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(g);
        waiter.join().unwrap();
        assert_eq!(*lock.lock(), 1);
        assert_eq!(lock.sleepers.load(Ordering::Relaxed), 0);
    }
}
