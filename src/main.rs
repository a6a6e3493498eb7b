//! `knowtation-sidecar`: thin entry point; everything lives in the library.
#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    knowtation_sidecar::cli::main()
}
