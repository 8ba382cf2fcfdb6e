//! The clock behind [`now_ns`](super::now_ns): nanoseconds since the Unix epoch, read from the
//! CPU's time-stamp counter where it runs at a constant rate, else from `CLOCK_MONOTONIC`.
//!
//! A vDSO `clock_gettime(CLOCK_MONOTONIC)` costs two to three `rdtsc`s (it orders the read and
//! scales it under a sequence lock), and allocators read the clock on every observed call. So,
//! like the Linux kernel's TSC clocksource and PyTorch's `getApproximateTime`, the counter is
//! scaled by a rate measured against `CLOCK_MONOTONIC`, without ever waiting for it:
//!
//! 1. Until [`CALIBRATE_AFTER_NS`] have passed since the first read, times come from
//!    `CLOCK_MONOTONIC` (shifted to the epoch once, at the first read).
//! 2. The first read after that measures the counter's rate over that window and switches to the
//!    counter, continuing from the monotonic time at the switch.
//! 3. The first read [`RECALIBRATE_AFTER_NS`] after the first read measures the rate again over
//!    that much longer window (an error of a few parts in 10^7) and switches once more,
//!    continuing from the counter's own time, so the clock never steps back.
//!
//! Each measurement brackets one counter read between two monotonic reads and is refused when
//! they lie more than [`MAX_BRACKET_NS`] apart (a preempted read). The counter is used only on
//! x86-64 when CPUID reports an invariant TSC (constant rate, running in every power state) and
//! the Linux kernel uses it as its own clocksource; elsewhere every read is a monotonic one. Nothing here allocates or blocks beyond a
//! `OnceLock` initialization (the instrumented global allocator reads this clock).

use std::sync::OnceLock;

use super::Event;
#[cfg(target_arch = "x86_64")]
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds per second.
const NS_PER_S: u64 = 1_000_000_000;
/// Monotonic time before the counter's rate is first measured.
pub(crate) const CALIBRATE_AFTER_NS: u64 = 50_000_000;
/// Monotonic time before the rate is measured the second (last) time.
pub(crate) const RECALIBRATE_AFTER_NS: u64 = 20 * NS_PER_S;
/// Widest bracket of two monotonic reads around a counter read that a measurement accepts.
const MAX_BRACKET_NS: u64 = 2_000;
/// Tries at a narrow bracket before a measurement gives up (and the next read tries again).
const BRACKET_TRIES: usize = 4;
/// Fraction bits of the fixed-point nanoseconds-per-tick rate.
const RATE_SHIFT: u32 = 32;
/// Rates outside (0.05, 20) ns per tick (20 GHz .. 50 MHz) mean the counter is not usable.
const RATE_MIN: u64 = (1 << RATE_SHIFT) / 20;
/// See [`RATE_MIN`].
const RATE_MAX: u64 = 20 << RATE_SHIFT;

/// `CLOCK_MONOTONIC` in nanoseconds.
#[cfg(unix)]
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on every unix we
    // build for, and on failure `ts` keeps its zeros.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64)
        .wrapping_mul(NS_PER_S)
        .wrapping_add(ts.tv_nsec as u64)
}

/// A monotonic clock in nanoseconds (since the first read).
#[cfg(not(unix))]
fn mono_ns() -> u64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// The time-stamp counter.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tsc() -> u64 {
    // SAFETY: `rdtsc` exists on every x86-64 CPU and has no memory effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Whether CPUID reports an invariant TSC (leaf 0x8000_0007, EDX bit 8).
#[cfg(target_arch = "x86_64")]
fn tsc_invariant() -> bool {
    const LEAF: u32 = 0x8000_0007;
    const INVARIANT_TSC: u32 = 1 << 8;
    // Leaf 0x8000_0000 reports the highest extended leaf; the power-management leaf is read
    // only when it is supported.
    let max = core::arch::x86_64::__cpuid(0x8000_0000).eax;
    max >= LEAF && core::arch::x86_64::__cpuid(LEAF).edx & INVARIANT_TSC != 0
}

/// Whether the kernel times itself by the TSC (its current clocksource is `tsc`): it checked
/// the counter's stability and synchronization across CPUs, which CPUID alone does not promise
/// (under some hypervisors, for instance). Read with `open`/`read` into a stack buffer, so the
/// check allocates nothing.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn kernel_uses_tsc() -> bool {
    const PATH: &std::ffi::CStr =
        c"/sys/devices/system/clocksource/clocksource0/current_clocksource";
    const EXPECTED: &[u8] = b"tsc\n";
    let mut buf = [0u8; 16];
    // SAFETY: PATH is NUL-terminated; the descriptor is checked before use and closed once;
    // `read` writes at most `buf.len()` bytes into `buf`.
    let n = unsafe {
        let fd = libc::open(PATH.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    usize::try_from(n).is_ok_and(|n| &buf[..n] == EXPECTED)
}

/// Elsewhere the kernel's choice is not known: the counter is not used.
#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn kernel_uses_tsc() -> bool {
    false
}

/// One counter read with the monotonic time it happened at (the later bracketing read).
#[derive(Debug, Clone, Copy)]
struct Sample {
    mono: u64,
    tsc: u64,
}

/// A counter read bracketed by monotonic reads at most [`MAX_BRACKET_NS`] apart.
#[cfg(target_arch = "x86_64")]
fn sample() -> Option<Sample> {
    for _ in 0..BRACKET_TRIES {
        let before = mono_ns();
        let t = tsc();
        let after = mono_ns();
        if after.wrapping_sub(before) <= MAX_BRACKET_NS {
            return Some(Sample {
                mono: after,
                tsc: t,
            });
        }
    }
    None
}

/// The state fixed at the first read.
struct Anchor {
    /// Epoch time minus monotonic time (wrapping), so `mono + offset` is epoch time.
    offset: u64,
    /// The first counter sample (`None` without a usable counter or when it was preempted).
    first: Option<Sample>,
}

fn anchor() -> &'static Anchor {
    static ANCHOR: OnceLock<Anchor> = OnceLock::new();
    ANCHOR.get_or_init(|| {
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mono = mono_ns();
        #[cfg(target_arch = "x86_64")]
        let first = if tsc_invariant() && kernel_uses_tsc() {
            sample()
        } else {
            None
        };
        #[cfg(not(target_arch = "x86_64"))]
        let first = None;
        Anchor {
            offset: epoch.wrapping_sub(mono),
            first,
        }
    })
}

/// A counter-to-epoch mapping: `ns_base + (tsc - tsc_base) * rate`.
#[derive(Debug, Clone, Copy)]
struct Scale {
    tsc_base: u64,
    ns_base: u64,
    /// Nanoseconds per tick, fixed point with [`RATE_SHIFT`] fraction bits.
    rate: u64,
    /// Ticks per nanosecond, fixed point with [`RATE_SHIFT`] fraction bits (for deadlines).
    ticks_per_ns: u64,
    /// Epoch time from which the rate should be measured again (`u64::MAX`: never).
    remeasure_at: u64,
}

impl Scale {
    /// Nanoseconds that `ticks` of the counter last at this scale's rate.
    #[inline(always)]
    fn ticks_ns(&self, ticks: u64) -> u64 {
        ((u128::from(ticks) * u128::from(self.rate)) >> RATE_SHIFT) as u64
    }

    #[inline(always)]
    fn at(&self, tsc: u64) -> u64 {
        // A counter a few ticks behind the base (another core) reads as the base.
        self.ns_base + self.ticks_ns(tsc.saturating_sub(self.tsc_base))
    }

    /// [`at`](Self::at) for a counter read taken under this scale, starting the final
    /// measurement when its time has come (as [`now_ns`] would have).
    #[inline]
    fn time(&self, tsc: u64) -> u64 {
        let t = self.at(tsc);
        if t >= self.remeasure_at {
            slow_now();
        }
        t
    }
}

/// The reciprocal of a plausible `rate` (both fixed point with [`RATE_SHIFT`] fraction bits).
fn ticks_per_ns(rate: u64) -> u64 {
    ((1u128 << (2 * RATE_SHIFT)) / u128::from(rate.max(1))) as u64
}

/// The rate between two samples, when it is plausible.
fn rate_between(a: Sample, b: Sample) -> Option<u64> {
    let ticks = b.tsc.checked_sub(a.tsc).filter(|&t| t > 0)?;
    let ns = b.mono.checked_sub(a.mono)?;
    let rate = (u128::from(ns) << RATE_SHIFT) / u128::from(ticks);
    u64::try_from(rate)
        .ok()
        .filter(|r| (RATE_MIN..=RATE_MAX).contains(r))
}

/// The two scales (first and final measurement); statics, so switching allocates nothing.
#[cfg(target_arch = "x86_64")]
static SCALES: [OnceLock<Scale>; 2] = [OnceLock::new(), OnceLock::new()];
/// The scale in use (null until the first measurement).
#[cfg(target_arch = "x86_64")]
static CURRENT: AtomicPtr<Scale> = AtomicPtr::new(std::ptr::null_mut());

/// The scale in use, once the counter clock runs.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn current() -> Option<&'static Scale> {
    // SAFETY: CURRENT only ever holds null or a pointer to an initialized `OnceLock` value in
    // the static SCALES, which lives and never changes for the whole program.
    unsafe { CURRENT.load(Ordering::Acquire).as_ref() }
}

/// Nanoseconds since the Unix epoch (see the module docs).
#[inline]
pub(crate) fn now_ns() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if let Some(s) = current() {
            let t = s.at(tsc());
            if t < s.remeasure_at {
                return t;
            }
        }
    }
    slow_now()
}

/// Bit set in a [`stamp`] that holds counter ticks rather than nanoseconds (epoch nanoseconds
/// stay below 2^63 until the year 2262, and a counter below it for decades of uptime). The
/// clock only ever switches from nanoseconds to the counter, so tagging the counter's stamps
/// makes every counter stamp compare above every nanosecond one: [`reached`] is one comparison.
const TSC_STAMP: u64 = 1 << 63;

/// A raw time stamp for [`stamp_ns`] to convert later: the bare time-stamp counter (tagged
/// with [`TSC_STAMP`]) while the counter clock runs (one `rdtsc`, which out-of-order execution
/// overlaps with the work around it, no scaling), else nanoseconds. The caching allocator
/// stamps each call this way and converts when it publishes a batch of events.
#[inline(always)]
pub(crate) fn stamp() -> u64 {
    #[cfg(target_arch = "x86_64")]
    if !CURRENT.load(Ordering::Relaxed).is_null() {
        return tsc() | TSC_STAMP;
    }
    now_ns()
}

/// Nanoseconds between two [`stamp`]s of one kind (`start` first; 0 if they are of two kinds),
/// at the current scale's rate: one multiplication, no lookup of the scales.
#[inline]
pub(crate) fn elapsed_ns(start: u64, end: u64) -> u64 {
    if (start ^ end) & TSC_STAMP != 0 {
        return 0;
    }
    if start & TSC_STAMP == 0 {
        return end.saturating_sub(start);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = current() {
        return s.ticks_ns(end.saturating_sub(start));
    }
    0
}

/// Nanoseconds since the Unix epoch of a [`stamp`]: what [`now_ns`] returned when it was
/// taken. A counter stamp is scaled by the scale that was current then: the current one, or the
/// first one for a stamp from before the final measurement's base.
#[inline]
pub(crate) fn stamp_ns(stamp: u64) -> u64 {
    if stamp & TSC_STAMP == 0 {
        return stamp;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(cur) = current() {
        let ticks = stamp & !TSC_STAMP;
        let s = if ticks >= cur.tsc_base {
            cur
        } else {
            SCALES[0].get().unwrap_or(cur)
        };
        return s.time(ticks);
    }
    // Not reached: a counter stamp is only taken once a scale is installed.
    now_ns()
}

/// Turns the [`stamp`]s in the `time_ns` of a batch of events, taken in order (under one
/// lock), into what [`stamp_ns`] gives. The usual batch, whose first stamp is a counter
/// stamp at or after the current scale's base, so that every later one is too, is scaled by
/// that one scale with one multiply-add per event and no branch; the remeasurement that
/// `now_ns` would start is checked once, on the last (largest) time. Other batches (around a
/// switch of the clock) convert stamp by stamp.
pub(crate) fn stamps_to_ns(events: &mut [Event]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(cur) = current()
        && let Some(first) = events.first()
        && first.time_ns >= cur.tsc_base | TSC_STAMP
    {
        // Every stamp is at least the first, so all are counter stamps.
        for e in events.iter_mut() {
            e.time_ns = cur.at(e.time_ns & !TSC_STAMP);
        }
        if events.last().is_some_and(|e| e.time_ns >= cur.remeasure_at) {
            slow_now();
        }
        return;
    }
    let (mut stamp, mut ns) = (u64::MAX, 0);
    for e in events.iter_mut() {
        // A call's events share its stamp.
        if e.time_ns != stamp {
            stamp = e.time_ns;
            ns = stamp_ns(stamp);
        }
        e.time_ns = ns;
    }
}

/// The stamp `ns` nanoseconds after `stamp`, of the same kind (see [`reached`]).
pub(crate) fn stamp_after(stamp: u64, ns: u64) -> u64 {
    if stamp & TSC_STAMP == 0 {
        return stamp.saturating_add(ns).min(!TSC_STAMP);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = current() {
        let ticks = (u128::from(ns) * u128::from(s.ticks_per_ns)) >> RATE_SHIFT;
        return stamp
            .saturating_add(u64::try_from(ticks).unwrap_or(u64::MAX))
            .min(u64::MAX - 1);
    }
    stamp
}

/// Whether the stamp `now` is at or past the deadline `at` (from [`stamp_after`]): one
/// comparison. A counter stamp is past every nanosecond deadline (the clock switched to the
/// counter in between), and no stamp reaches `u64::MAX` (no deadline).
#[inline(always)]
pub(crate) fn reached(now: u64, at: u64) -> bool {
    now >= at
}

/// Whether time comes from the counter (a scale is installed).
pub(crate) fn uses_counter() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        current().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A monotonic read, and the switches to the counter when their time has come.
#[cold]
#[inline(never)]
fn slow_now() -> u64 {
    let a = anchor();
    #[cfg(target_arch = "x86_64")]
    if let Some(first) = a.first {
        match current() {
            None => {
                if let Some(t) = switch(a, first, None) {
                    return t;
                }
            }
            Some(s) => return switch(a, first, Some(s)).unwrap_or_else(|| s.at(tsc())),
        }
    }
    mono_ns().wrapping_add(a.offset)
}

/// Measures the rate since `first` and installs the next scale when enough time has passed;
/// returns the time then. `prev` is the scale in use (None: still on the monotonic clock).
#[cfg(target_arch = "x86_64")]
fn switch(a: &Anchor, first: Sample, prev: Option<&Scale>) -> Option<u64> {
    let (slot, wait, next_at) = match prev {
        None => (0, CALIBRATE_AFTER_NS, RECALIBRATE_AFTER_NS),
        Some(_) => (1, RECALIBRATE_AFTER_NS, u64::MAX),
    };
    if mono_ns().wrapping_sub(first.mono) < wait {
        return None;
    }
    let now = sample()?;
    let rate = rate_between(first, now)?;
    let ns_base = match prev {
        // Continue from the monotonic time (stage 2) or the counter's time (stage 3).
        None => now.mono.wrapping_add(a.offset),
        Some(s) => s.at(now.tsc),
    };
    let remeasure_at = if next_at == u64::MAX {
        u64::MAX
    } else {
        first.mono.wrapping_add(a.offset).saturating_add(next_at)
    };
    let scale = SCALES[slot].get_or_init(|| Scale {
        tsc_base: now.tsc,
        ns_base,
        rate,
        ticks_per_ns: ticks_per_ns(rate),
        remeasure_at,
    });
    let expected = prev.map_or(std::ptr::null_mut(), |s| std::ptr::from_ref(s).cast_mut());
    // Losing the race means another thread installed this very slot (or a later one).
    let _ = CURRENT.compare_exchange(
        expected,
        std::ptr::from_ref(scale).cast_mut(),
        Ordering::AcqRel,
        Ordering::Acquire,
    );
    current().map(|s| s.at(tsc()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_between_samples_is_nanoseconds_per_tick_in_fixed_point() {
        let a = Sample { mono: 0, tsc: 0 };
        // A 2.5 GHz counter: 0.4 ns per tick.
        let b = Sample {
            mono: NS_PER_S,
            tsc: 2_500_000_000,
        };
        let r = rate_between(a, b).unwrap();
        assert_eq!(r, ((NS_PER_S as u128) << RATE_SHIFT) as u64 / 2_500_000_000);
        // Implausible rates and a counter that went backwards are refused.
        assert_eq!(
            rate_between(
                a,
                Sample {
                    mono: 1,
                    tsc: 1 << 40
                }
            ),
            None
        );
        assert_eq!(rate_between(b, a), None);
    }

    #[test]
    fn a_scale_continues_from_its_base_and_clamps_a_counter_behind_it() {
        let s = Scale {
            tsc_base: 1000,
            ns_base: 5_000,
            rate: 2 << RATE_SHIFT,
            ticks_per_ns: ticks_per_ns(2 << RATE_SHIFT),
            remeasure_at: u64::MAX,
        };
        assert_eq!(s.at(1000), 5_000);
        assert_eq!(s.at(1010), 5_020);
        assert_eq!(s.at(900), 5_000);
        // Two nanoseconds a tick: half a tick a nanosecond.
        assert_eq!(s.ticks_per_ns, 1 << (RATE_SHIFT - 1));
    }

    #[test]
    fn stamps_convert_to_the_time_now_ns_gives_and_deadlines_lie_ahead() {
        // Across the switch to the counter: stamps taken between two clock reads convert to a
        // time between them, and never go back.
        let until = mono_ns() + CALIBRATE_AFTER_NS + CALIBRATE_AFTER_NS / 2;
        let mut last = 0;
        let mut counter_stamps = 0;
        // Batches of stamps (two events a stamp, as a malloc/free pair's calls) convert as
        // the stamps do one by one.
        let mut batch: Vec<Event> = Vec::new();
        let mut expected: Vec<u64> = Vec::new();
        while mono_ns() < until {
            let before = now_ns();
            let st = stamp();
            let after = now_ns();
            let t = stamp_ns(st);
            for _ in 0..2 {
                batch.push(Event {
                    time_ns: st,
                    ..Event::EMPTY
                });
                expected.push(t);
            }
            if batch.len() == crate::event::MAX_BATCH {
                stamps_to_ns(&mut batch);
                let got: Vec<u64> = batch.iter().map(|e| e.time_ns).collect();
                assert_eq!(got, expected);
                batch.clear();
                expected.clear();
            }
            assert!(
                before <= t && t <= after,
                "stamp {st:#x} read {t}, outside [{before}, {after}]"
            );
            assert!(t >= last, "stamps went back: {t} < {last}");
            last = t;
            if st & TSC_STAMP != 0 {
                counter_stamps += 1;
            }
            let d = stamp_after(st, 1_000_000);
            let ahead = stamp_ns(d) - t;
            assert!(
                (990_000..=1_010_000).contains(&ahead),
                "a 1 ms deadline lies {ahead} ns ahead"
            );
            assert!(reached(d, d) && !reached(st, d));
            if st & TSC_STAMP == 0 {
                // The clock may switch to the counter before the deadline: then it has passed.
                assert!(reached(TSC_STAMP | 1, d));
            }
        }
        #[cfg(target_arch = "x86_64")]
        if anchor().first.is_some() {
            assert!(counter_stamps > 0, "the counter clock never started");
        }
        let _ = counter_stamps;
    }

    #[test]
    fn the_clock_never_goes_back_across_the_switch_to_the_counter() {
        let start = now_ns();
        let mut last = start;
        // Read past the first calibration point.
        let until = mono_ns() + CALIBRATE_AFTER_NS + CALIBRATE_AFTER_NS / 2;
        while mono_ns() < until {
            let t = now_ns();
            assert!(t >= last, "clock went back: {t} < {last}");
            last = t;
        }
        // One read after the loop's end: the thread may have been preempted between the
        // loop's last read and its check of the monotonic clock.
        let end = now_ns();
        assert!(end >= last, "clock went back: {end} < {last}");
        // The clock followed the monotonic clock (within a generous bound).
        let elapsed = end - start;
        assert!(elapsed >= CALIBRATE_AFTER_NS, "elapsed {elapsed}");
        let system = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(
            system.abs_diff(now_ns()) < NS_PER_S,
            "far from the system clock"
        );
    }
}
