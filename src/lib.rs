//! knowtation-sidecar: a choke point in front of a Knowtation hub gateway.
//!
//! The daemon crate of the workspace, on top of the pure views crate
//! (`knowtation_views`: [`extract`], [`path`], [`js`], [`json_cost`], re-exported here)
//! and the demo's loopback upstreams (`knowtation_mock_upstream`). [`config`] is plain
//! data at the bottom; [`route`] is the one door that decides which handler a request
//! belongs to; [`budget`] admits authenticated work that holds a slot or buffered bytes.
//! The request phases run classify ([`route`], [`mcp`]'s door) → authenticate ([`auth`])
//! → validate ([`path`], [`ratelimit`]) → one upstream read ([`hosted`], [`canister`]
//! over [`upstream`]) → extract → serialize, in [`rest`] for the REST route and [`mcp`]
//! for the hosted MCP tools; [`proxy`] is the daemon around them (passthrough included),
//! [`shadow`] compares the gateway's answers with the sidecar's own, [`admin`] serves
//! health and metrics, and [`cli`] is the command line built on all of it. Test support
//! lives in the `knowtation-testkit` crate, a dev-dependency only.
#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod budget;
pub mod canister;
pub mod cli;
pub mod config;
pub mod cors;
pub mod demo;

pub mod hosted;

pub mod limits;
pub mod logging;
pub mod mcp;

pub mod proxy;
pub mod ratelimit;
pub mod rest;
pub mod route;
pub mod shadow;
pub mod telemetry;

pub mod upstream;
pub mod worker;

// The pure views crate, re-exported under the names the daemon's modules have always
// used: `crate::extract` and friends read the same from inside and outside.
pub use knowtation_views::{extract, js, json_cost, path};
