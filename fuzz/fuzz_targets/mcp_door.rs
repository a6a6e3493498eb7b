//! The `/mcp` door and its canonical re-serialization (wire contract §6 Deviations). The
//! checks live in `knowtation_testkit::fuzz::mcp_door`, which
//! `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| knowtation_testkit::fuzz::mcp_door(data));
