//! Vault-path validation (wire contract §3, §4). The checks live in
//! `knowtation_testkit::fuzz::path`, which `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| knowtation_testkit::fuzz::path(data));
