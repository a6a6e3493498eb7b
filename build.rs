//! Build facts the binary reports (`--version`, `knowtation_sidecar_build_info`): the
//! commit it was built from and the compiler that built it.
//!
//! The commit is `KNOWTATION_SIDECAR_COMMIT` when set (an image build passes it in, having
//! no `.git`), else what `git rev-parse` says when the sources are a git checkout, else
//! `unknown`: a build from a tarball works all the same.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=KNOWTATION_SIDECAR_COMMIT");
    let commit = match std::env::var("KNOWTATION_SIDECAR_COMMIT") {
        Ok(c) if is_commit(c.trim()) => c.trim().to_owned(),
        _ => git_commit().unwrap_or_else(|| "unknown".to_owned()),
    };
    println!("cargo:rustc-env=KNOWTATION_SIDECAR_COMMIT={commit}");

    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = run(Command::new(rustc).arg("--version"))
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        .filter(|v| {
            v.chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-".contains(c))
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=KNOWTATION_SIDECAR_RUSTC={version}");
}

/// A hex object name, so nothing else ends up in a label or the version line.
fn is_commit(s: &str) -> bool {
    (7..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The checked-out commit (12 hex digits), with a rerun whenever it moves; `None` outside
/// a git checkout or without git.
fn git_commit() -> Option<String> {
    let commit = run(Command::new("git").args(["rev-parse", "--short=12", "HEAD"]))?;
    if !is_commit(&commit) {
        return None;
    }
    // HEAD, the branch it points at and the packed refs: whichever exists. A path that
    // does not exist would rerun this script on every build.
    let mut watched = vec![run(Command::new("git").args([
        "rev-parse",
        "--git-path",
        "HEAD",
    ]))];
    if let Some(branch) = run(Command::new("git").args(["symbolic-ref", "-q", "HEAD"])) {
        watched.push(run(Command::new("git").args([
            "rev-parse",
            "--git-path",
            &branch,
        ])));
    }
    watched.push(
        run(Command::new("git").args(["rev-parse", "--git-common-dir"]))
            .map(|d| format!("{d}/packed-refs")),
    );
    for path in watched.into_iter().flatten() {
        if Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(commit)
}

/// A command's trimmed standard output, when it ran and succeeded.
fn run(command: &mut Command) -> Option<String> {
    let out = command.output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.trim().to_owned())
}
