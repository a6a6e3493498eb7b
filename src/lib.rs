//! knowtation-sidecar: a choke point in front of a Knowtation hub gateway.
//!
//! The crate is a library first. [`extract`] is the pure SectionSource v0 extractor (no
//! I/O), [`path`] the vault-path validator shared by every surface, [`proxy`] the daemon
//! (passthrough plus the intercepted route), [`admin`] its health and metrics listener,
//! and [`cli`] the command line built on them. [`route`] is the one door that decides
//! which handler a request belongs to; [`budget`] admits authenticated work that holds a
//! slot or buffered bytes, with [`json_cost`] (what a JSON parse will hold, reserved
//! first). [`rest`] answers the REST route itself,
//! with [`auth`] (caller identity), [`hosted`] (the bridge lookup), [`canister`] (the one
//! note read) and [`ratelimit`]. [`mcp`] answers the hosted MCP tool `get_section_source`
//! and watches the rest of `/mcp`. [`shadow`] compares the gateway's answers with the
//! sidecar's own in shadow mode. [`testkit`] holds the loopback mock upstreams that
//! the integration tests and the `demo` command run against.
#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod budget;
pub mod canister;
pub mod cli;
pub mod config;
pub mod cors;
pub mod demo;
pub mod extract;
pub mod hosted;
pub mod js;
pub mod json_cost;
pub mod limits;
pub mod logging;
pub mod mcp;
pub mod path;
pub mod proxy;
pub mod ratelimit;
pub mod rest;
pub mod route;
pub mod shadow;
pub mod telemetry;
pub mod testkit;
pub mod upstream;
