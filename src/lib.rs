//! knowtation-sidecar: a choke point in front of a Knowtation hub gateway.
//!
//! The crate is a library first. [`extract`] is the pure SectionSource v0 extractor (no
//! I/O), [`path`] the vault-path validator shared by every surface, and [`cli`] the
//! command line built on them.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod extract;
pub mod path;
pub mod telemetry;
