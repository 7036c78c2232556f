//! Shared helpers for the benchmarks and baseline servers.

pub mod alloc_counter;
pub mod echo;
pub mod tls_fixture;
