//! Test support for knowtation-sidecar, used by its integration tests, benchmarks and
//! fuzz targets as a dev-dependency and never linked into the binary:
//!
//! - the mock upstreams of [`knowtation_mock_upstream`], re-exported;
//! - [`FaultServer`]: a raw-TCP upstream that misbehaves on purpose (resets, stalls,
//!   drips, HTTP/1.0, repeated framing headers, endless bodies) for the fault tests;
//! - [`client`]: a small HTTP/1.1 client with timeouts, so tests never hang;
//! - [`fuzz`]: the checks the fuzz targets run, replayed over the committed corpora by
//!   `tests/fuzz_corpus.rs`.
//!
//! It may use every crate of the workspace; none of them may use it outside tests.
#![forbid(unsafe_code)]

pub mod client;
pub mod fault;
pub mod fuzz;

pub use fault::{FaultServer, Script};
pub use knowtation_mock_upstream::*;
