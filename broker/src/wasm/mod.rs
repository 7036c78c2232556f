//! WASM router host (being written).
