//! A counting global allocator, to prove "zero heap allocations per frame".
//!
//! A benchmark installs it and wraps the code under test in [`count`]:
//!
//! ```
//! use mcp_bench::alloc_counter::{CountingAlloc, count};
//!
//! #[global_allocator]
//! static ALLOC: CountingAlloc = CountingAlloc;
//!
//! fn main() {
//!     let (v, stats) = count(|| vec![0u8; 64]);
//!     assert_eq!((v.len(), stats.allocs, stats.bytes), (64, 1, 64));
//!     let ((), stats) = count(|| drop(v));
//!     assert_eq!(stats.deallocs, 1);
//! }
//! ```
//!
//! Counters are per thread, so
//! a harness thread (or another benchmark's worker) allocating at the same
//! time does not pollute the figure; the code measured must therefore run
//! on the calling thread, as the shard's routing path does.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting every call made on the current thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

/// Heap activity on one thread over some span of code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// `alloc` and `alloc_zeroed` calls.
    pub allocs: u64,
    /// `realloc` calls (each may move the block: as costly as an alloc).
    pub reallocs: u64,
    /// `dealloc` calls.
    pub deallocs: u64,
    /// Bytes requested by `alloc`, `alloc_zeroed` and `realloc` (new size).
    pub bytes: u64,
}

impl AllocStats {
    /// Allocating calls (allocs + reallocs): what "zero allocations" means.
    pub fn allocating_calls(&self) -> u64 {
        self.allocs + self.reallocs
    }

    fn since(self, start: AllocStats) -> AllocStats {
        AllocStats {
            allocs: self.allocs - start.allocs,
            reallocs: self.reallocs - start.reallocs,
            deallocs: self.deallocs - start.deallocs,
            bytes: self.bytes - start.bytes,
        }
    }
}

thread_local! {
    // `const` initialisation with a destructor-free type: reading these
    // never allocates or registers a TLS destructor, which would recurse
    // into the allocator.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static REALLOCS: Cell<u64> = const { Cell::new(0) };
    static DEALLOCS: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

fn bump(counter: &'static std::thread::LocalKey<Cell<u64>>, by: u64) {
    // `try_with`: the allocator may be called while the thread is being torn
    // down; a lost count there is harmless, a panic is not.
    let _ = counter.try_with(|c| c.set(c.get() + by));
}

fn read(counter: &'static std::thread::LocalKey<Cell<u64>>) -> u64 {
    counter.try_with(Cell::get).unwrap_or(0)
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; the counters are thread-local `Cell`s that neither allocate nor
// unwind.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump(&ALLOCS, 1);
        bump(&BYTES, layout.size() as u64);
        // SAFETY: forwarded from the caller, who upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump(&ALLOCS, 1);
        bump(&BYTES, layout.size() as u64);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        bump(&DEALLOCS, 1);
        // SAFETY: `ptr` was returned by `System` through this allocator with
        // `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump(&REALLOCS, 1);
        bump(&BYTES, new_size as u64);
        // SAFETY: as for `dealloc`, and `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// The current thread's counters since it started.
pub fn snapshot() -> AllocStats {
    AllocStats {
        allocs: read(&ALLOCS),
        reallocs: read(&REALLOCS),
        deallocs: read(&DEALLOCS),
        bytes: read(&BYTES),
    }
}

/// Runs `f` and returns what it allocated on this thread. Meaningful only
/// when [`CountingAlloc`] is the global allocator.
pub fn count<R>(f: impl FnOnce() -> R) -> (R, AllocStats) {
    let start = snapshot();
    let r = f();
    (r, snapshot().since(start))
}
