//! The one request classifier (wire contract §5, §6). The checks live in
//! `knowtation_testkit::fuzz::route`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| knowtation_testkit::fuzz::route(data));
