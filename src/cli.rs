//! The command line.

use std::process::ExitCode;

/// Runs the command line; returns the process exit code.
pub fn main() -> ExitCode {
    ExitCode::SUCCESS
}
