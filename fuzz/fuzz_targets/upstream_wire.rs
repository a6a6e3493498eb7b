//! The HTTP/1.1 read from plain-http upstreams (answer heads, chunked bodies). The checks
//! live in `knowtation_testkit::fuzz::upstream_wire`, which
//! `tests/fuzz_corpus.rs` replays.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| knowtation_testkit::fuzz::upstream_wire(data));
