//! The epoch ticker: advances the engine's epoch while guest code may run,
//! and parks once none has run for [`PARK_AFTER`].
//!
//! Why: a running guest yields to its shard, or is cut at its deadline,
//! only when the epoch moves, so the epoch must move whenever guest code
//! runs. A ticker that never stopped woke an idle broker about 810 times a
//! second (`/proc/PID/task/*/status`, 10 s idle: `wasm-epoch` 810
//! context switches a second, every other thread together 6).
//!
//! How, without a memory barrier on the call path (the call costs about
//! 1 µs, a full barrier 10–20 ns): every thread that runs guest code owns a
//! [`Slot`] (thread-local, registered once), written by that thread only,
//! with plain stores:
//! - `depth`: guest polls under way on the thread (a host import may run
//!   another router's call inside one);
//! - `entries`: polls begun, ever.
//!
//! At each tick the ticker reads every slot. After [`PARK_AFTER`] of ticks
//! with no poll under way and none begun, it parks: Dekker's handshake,
//! with the barrier on the rare side only. The ticker publishes that it
//! parks, then runs `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which
//! makes every thread of the process pass a full barrier, then reads the
//! slots once more. A guest thread writes its slot, then reads the parked
//! flag behind a compiler fence only. Either the ticker's second look sees
//! the write and it does not park, or the thread sees the flag and wakes
//! it: a guest never runs with the epoch standing still. Where `membarrier`
//! is refused (a kernel before 4.14, a seccomp filter), the ticker never
//! parks, as before.
//!
//! The slots are process-wide, not per host: a process normally has one
//! host, and a test process with several only keeps every ticker awake
//! while any of them runs guest code.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, compiler_fence};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::Thread;
use std::time::Duration;

use wasmtime::EngineWeak;

/// How long no guest code may have run before the ticker parks. Long
/// against the gaps of steady traffic (a broker at 20 calls a second keeps
/// ticking, and never pays for a wake-up), short against an idle broker's
/// lifetime.
pub const PARK_AFTER: Duration = Duration::from_millis(50);

/// One thread's marks of running guest code. Alone on its cache lines: the
/// owner writes it on every poll, the ticker reads it once a tick.
#[repr(align(128))]
#[derive(Default)]
struct Slot {
    depth: AtomicU64,
    entries: AtomicU64,
    /// [`TICKS`] when the innermost poll under way began; read by this
    /// thread only ([`ticked_in_this_poll`]).
    entered_at: AtomicU64,
}

/// Ticks made, by every ticker of the process (a test process may run
/// several hosts), each counted before its engine's epoch moves: a guest
/// that sees its epoch deadline passed, and this count where it was when
/// its poll began, was suspended, not running, when the epoch moved.
static TICKS: AtomicU64 = AtomicU64::new(0);

/// Every live thread's slot (dead threads' are pruned at the next read).
static SLOTS: Mutex<Vec<Weak<Slot>>> = Mutex::new(Vec::new());
/// Some ticker is parked, or about to: the only shared word a guest poll
/// reads, and it is written only when a ticker parks or is woken.
static PARKED: AtomicBool = AtomicBool::new(false);
/// The tickers that are parked, or about to, and wait for a guest.
static SLEEPERS: Mutex<Vec<Thread>> = Mutex::new(Vec::new());

thread_local! {
    static SLOT: Arc<Slot> = {
        let slot = Arc::new(Slot::default());
        lock(&SLOTS).push(Arc::downgrade(&slot));
        slot
    };
}

/// A poisoned lock here only means a thread panicked while pushing to a
/// `Vec`: the data is still whole.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks guest code running on this thread until dropped. Taken around
/// every poll of a guest future ([`super::host::drive`]). Not `Send` (it
/// points at this thread's slot), and never outlives the poll it marks.
/// Keeps the outer poll's [`Slot::entered_at`], restored at its drop.
pub(crate) struct GuestRunning(*const Slot, u64);

impl GuestRunning {
    #[inline]
    pub(crate) fn enter() -> Self {
        // A pointer, not an `Arc` clone: the clone's atomic increment is a
        // full barrier on x86, the cost this design avoids.
        let ptr = SLOT.with(Arc::as_ptr);
        // SAFETY: the thread-local `Arc` keeps the slot alive until this
        // thread exits, and the guard is dropped within the poll it marks.
        let slot = unsafe { &*ptr };
        // Only this thread writes its slot: load and store, no atomic
        // read-modify-write (which would be a full barrier on x86).
        let depth = slot.depth.load(Ordering::Relaxed);
        slot.depth.store(depth + 1, Ordering::Relaxed);
        let entries = slot.entries.load(Ordering::Relaxed);
        slot.entries.store(entries + 1, Ordering::Relaxed);
        let outer = slot.entered_at.load(Ordering::Relaxed);
        slot.entered_at
            .store(TICKS.load(Ordering::Relaxed), Ordering::Relaxed);
        // The stores above come before the load below in program order;
        // the ticker's `membarrier` supplies the hardware half of the fence
        // (module doc).
        compiler_fence(Ordering::SeqCst);
        if PARKED.load(Ordering::Relaxed) {
            wake_sleepers();
        }
        Self(ptr, outer)
    }
}

/// Whether a tick was made since the innermost guest poll under way on
/// this thread began. Asked by the epoch callback: a guest suspended in
/// an async host call while the epoch moved finds its deadline passed as
/// soon as it resumes, though it has not run for a tick; such a callback
/// neither counts a tick nor yields.
pub(crate) fn ticked_in_this_poll() -> bool {
    let entered = SLOT.with(|s| s.entered_at.load(Ordering::Relaxed));
    TICKS.load(Ordering::Relaxed) != entered
}

impl Drop for GuestRunning {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: as in `enter`; this is still the thread that took it.
        let slot = unsafe { &*self.0 };
        slot.entered_at.store(self.1, Ordering::Relaxed);
        let depth = slot.depth.load(Ordering::Relaxed);
        slot.depth.store(depth - 1, Ordering::Release);
    }
}

#[cold]
fn wake_sleepers() {
    if PARKED.swap(false, Ordering::AcqRel) {
        for t in lock(&SLEEPERS).drain(..) {
            t.unpark();
        }
    }
}

/// What the slots said at one reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reading {
    /// Some thread is inside a guest poll.
    running: bool,
    /// Polls begun, summed over the live threads.
    entries: u64,
}

fn read_slots() -> Reading {
    let mut slots = lock(&SLOTS);
    let mut r = Reading {
        running: false,
        entries: 0,
    };
    slots.retain(|w| match w.upgrade() {
        Some(s) => {
            r.running |= s.depth.load(Ordering::Acquire) > 0;
            r.entries = r.entries.wrapping_add(s.entries.load(Ordering::Relaxed));
            true
        }
        None => false,
    });
    r
}

/// `membarrier(2)` commands (`linux/membarrier.h`).
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

fn membarrier(cmd: libc::c_long) -> bool {
    // SAFETY: membarrier takes two integer arguments besides the command
    // and touches no memory of ours.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) == 0 }
}

/// Registers the process for the expedited barrier the ticker needs to
/// park. False: the ticker must never park.
pub(crate) fn can_park() -> bool {
    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
}

/// The ticker thread's loop: ticks every `tick` until `stop`, parking while
/// no guest code runs. `parked` says whether it is parked now (for tests
/// and diagnostics).
pub(crate) fn run(
    engine: EngineWeak,
    tick: Duration,
    stop: &AtomicBool,
    parked: &AtomicBool,
    may_park: bool,
) {
    if !request_short_slice() {
        tracing::debug!(
            "the kernel refused a short scheduler slice: a tick may wait behind a busy thread"
        );
    }
    let park_after = (PARK_AFTER.as_nanos() / tick.as_nanos().max(1)).max(1);
    let mut seen = read_slots();
    let mut quiet = 0u128;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        match engine.upgrade() {
            Some(engine) => {
                // Before the epoch: a guest that sees the new epoch sees
                // this count too (`ticked_in_this_poll`).
                TICKS.fetch_add(1, Ordering::Release);
                engine.increment_epoch();
            }
            None => break,
        }
        let now = read_slots();
        if now.running || now.entries != seen.entries {
            seen = now;
            quiet = 0;
            continue;
        }
        quiet += 1;
        if may_park && quiet >= park_after {
            park(&mut seen, stop, parked);
            quiet = 0;
        }
    }
}

/// The slice the ticker asks the scheduler for: the shortest it grants.
const SLICE: Duration = Duration::from_micros(100);

/// Asks the scheduler to let the calling thread (the ticker) preempt the
/// thread it wakes beside: a custom slice, shorter than the default, which
/// Linux 6.12+ (EEVDF) grants any thread and honours on wake-up.
///
/// Why: a tick is due exactly when a guest computes, which is when the
/// ticker's CPU is busy, often with that very guest's shard. On the default
/// slice the woken ticker waited for the busy thread's slice to run out:
/// ticks came 2-5 ms late, and a request behind a computing guest waited
/// that long instead of one tick (bench/NOTES.md, "a computing guest held
/// its shard's sockets"). Keeps the thread's policy class and nice value.
/// False where refused (older kernels ignore or refuse the field).
fn request_short_slice() -> bool {
    /// `struct sched_attr` (`linux/sched/types.h`), its first version.
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        policy: u32,
        flags: u64,
        nice: i32,
        priority: u32,
        runtime: u64,
        deadline: u64,
        period: u64,
    }
    // SAFETY: plain libc calls on the calling thread; `attr` outlives the
    // call and is the size it says.
    unsafe {
        let policy = libc::sched_getscheduler(0);
        if policy != libc::SCHED_OTHER && policy != libc::SCHED_BATCH {
            // Real-time, or idle: someone chose it; keep it.
            return false;
        }
        *libc::__errno_location() = 0;
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        if nice == -1 && *libc::__errno_location() != 0 {
            return false;
        }
        let attr = SchedAttr {
            size: std::mem::size_of::<SchedAttr>() as u32,
            policy: policy as u32,
            flags: 0,
            nice,
            priority: 0,
            runtime: SLICE.as_nanos() as u64,
            deadline: 0,
            period: 0,
        };
        libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) == 0
    }
}

/// Parks until a guest thread wakes this ticker or `stop` is set (and the
/// thread unparked). Returns at once if guest code ran since `seen`.
fn park(seen: &mut Reading, stop: &AtomicBool, parked: &AtomicBool) {
    let me = std::thread::current();
    lock(&SLEEPERS).push(me.clone());
    PARKED.store(true, Ordering::SeqCst);
    // Every thread of the process passes a full barrier: a slot written
    // before its thread read `PARKED` as false is visible below.
    let barrier = membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
    let now = read_slots();
    if !barrier || now.running || now.entries != seen.entries {
        lock(&SLEEPERS).retain(|t| t.id() != me.id());
        *seen = now;
        return;
    }
    parked.store(true, Ordering::Relaxed);
    // Woken means taken off the list; `park` may also return spuriously.
    while !stop.load(Ordering::Relaxed) && lock(&SLEEPERS).iter().any(|t| t.id() == me.id()) {
        std::thread::park();
    }
    parked.store(false, Ordering::Relaxed);
    lock(&SLEEPERS).retain(|t| t.id() != me.id());
    *seen = read_slots();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poll_is_seen_while_it_runs_and_counted_after() {
        let before = read_slots();
        let g = GuestRunning::enter();
        let during = read_slots();
        assert!(during.running);
        assert_ne!(during.entries, before.entries);
        // Nested: the inner guard's end leaves the outer poll running.
        drop(GuestRunning::enter());
        assert!(read_slots().running);
        drop(g);
        // Other tests of this process may be polling guests: only this
        // thread's slot is certain to be idle.
        SLOT.with(|s| assert_eq!(s.depth.load(Ordering::Relaxed), 0));
    }

    /// The running kernel's (major, minor) version.
    fn kernel() -> (u32, u32) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut parts = release
            .trim()
            .split(['.', '-'])
            .map(|p| p.parse().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    #[test]
    fn the_ticker_thread_gets_the_short_slice_it_asks_for() {
        if kernel() < (6, 12) {
            eprintln!(
                "skipped: custom slices need Linux 6.12, this is {:?}",
                kernel()
            );
            return;
        }
        let (granted, runtime, nice_kept) = std::thread::spawn(|| {
            // SAFETY: plain calls on this thread.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 3) };
            let granted = request_short_slice();
            // `struct sched_attr`, read back with `sched_getattr`.
            let mut attr = [0u64; 7];
            // SAFETY: the buffer is 56 bytes, as the call is told.
            let r = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, attr.as_mut_ptr(), 56, 0) };
            assert_eq!(r, 0, "sched_getattr: {}", std::io::Error::last_os_error());
            // SAFETY: as above.
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            (granted, attr[3], nice == 3)
        })
        .join()
        .unwrap();
        assert!(granted, "sched_setattr refused the slice");
        assert_eq!(runtime, SLICE.as_nanos() as u64, "the slice read back");
        assert!(nice_kept, "the thread's nice value changed");
    }

    #[test]
    fn a_dead_threads_slot_is_pruned_and_its_count_kept_out() {
        let slot = std::thread::spawn(|| {
            drop(GuestRunning::enter());
            SLOT.with(Arc::downgrade)
        })
        .join()
        .unwrap();
        read_slots();
        assert!(slot.upgrade().is_none());
        assert!(
            !lock(&SLOTS).iter().any(|w| w.ptr_eq(&slot)),
            "a dead thread's slot stays registered"
        );
    }
}
