//! Shared helpers for the benchmarks and baseline servers.
