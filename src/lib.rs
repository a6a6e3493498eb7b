//! knowtation-sidecar: a choke point in front of a Knowtation hub gateway.
//!
//! The crate is a library first. [`extract`] is the pure SectionSource v0 extractor (no
//! I/O), [`path`] the vault-path validator shared by every surface, [`proxy`] the daemon
//! (passthrough plus the intercepted route), [`admin`] its health and metrics listener,
//! and [`cli`] the command line built on them.
#![forbid(unsafe_code)]

pub mod admin;
pub mod cli;
pub mod config;
pub mod extract;
pub mod limits;
pub mod path;
pub mod proxy;
pub mod rest;
pub mod telemetry;
pub mod upstream;
