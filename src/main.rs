//! `knowtation-sidecar`: thin entry point; everything lives in the library.
#![forbid(unsafe_code)]

use std::process::ExitCode;

/// jemalloc rather than the C library's malloc: the per-request buffers of the REST and
/// MCP routes cost measurably less CPU (docs/benchmarks.md, "Allocator").
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    knowtation_sidecar::cli::main()
}
