//! libFuzzer target: arbitrary bytes through the frame codec. The input
//! layout and every property checked are in `../harness.rs`.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::run(data));
