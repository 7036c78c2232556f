//! Ctrl-C: the first SIGINT ends the send phase at once and lets the
//! outstanding responses drain (bounded by `--drain`), so the run still
//! prints and writes what it measured; a second SIGINT stops without
//! waiting. The process then exits 130 (128 + SIGINT), as shells expect of
//! an interrupted program.
//!
//! # Invariants
//! - The handler only increments an atomic (async-signal-safe); the engine
//!   polls it on its tick, never from the handler.

use std::sync::atomic::{AtomicU32, Ordering};

static SIGINTS: AtomicU32 = AtomicU32::new(0);

const SIGINT: i32 = 2;

/// The exit status of an interrupted run.
pub const EXIT_CODE: u8 = 130;

unsafe extern "C" {
    /// `signal(2)` from the C library (glibc: BSD semantics, the handler
    /// stays installed and interrupted system calls restart).
    fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
}

extern "C" fn on_sigint(_: i32) {
    SIGINTS.fetch_add(1, Ordering::Relaxed);
}

/// Installs the handler. Until then SIGINT kills the process as usual.
pub fn install() -> std::io::Result<()> {
    // SAFETY: `on_sigint` is async-signal-safe (one atomic increment) and
    // lives for the whole program; `signal` only records its address.
    let prev = unsafe { signal(SIGINT, on_sigint) };
    if prev == usize::MAX {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// How many SIGINTs have arrived.
pub fn count() -> u32 {
    SIGINTS.load(Ordering::Relaxed)
}
