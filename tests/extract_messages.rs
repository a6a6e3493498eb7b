//! `extract` on the command line, as someone reads its messages: each names the input
//! and what is wrong with it (which cap, how large), tells a missing file from a
//! directory and from one that is not UTF-8, reads standard input for `-`, and refuses a
//! flag that means nothing for the input given as a usage error.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

const BIN: &str = env!("CARGO_BIN_EXE_knowtation-sidecar");

/// A fresh directory under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ks-extract-msg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn file(&self, name: &str, contents: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `extract` with `args`, `stdin` on standard input: (exit code, stdout, stderr).
fn extract(args: &[&str], stdin: &[u8]) -> (Option<i32>, String, String) {
    let mut child = Command::new(BIN)
        .arg("extract")
        .args(args)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    // A refused input may be dropped unread: a broken pipe is not this test's failure.
    let _ = input.write_all(stdin);
    drop(input);
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().unwrap();
    (
        status.code(),
        String::from_utf8(stdout).unwrap(),
        String::from_utf8(stderr).unwrap(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn missing_not_a_file_and_not_utf8_are_told_apart() {
    let dir = TempDir::new();
    let missing = dir.0.join("missing.md");
    let bad = dir.file("latin1.md", b"# caf\xe9\n");
    for (input, want) in [
        (
            s(&missing).to_owned(),
            format!("error: {}: no such file", s(&missing)),
        ),
        (
            s(&dir.0).to_owned(),
            format!("error: {}: is a directory, not a file", s(&dir.0)),
        ),
        (
            s(&bad).to_owned(),
            format!(
                "error: {}: not UTF-8 (the first invalid byte is at offset 5)",
                s(&bad)
            ),
        ),
    ] {
        let (code, out, err) = extract(&["--path", "a.md", &input], b"");
        assert_eq!(code, Some(1), "{err}");
        assert!(out.is_empty(), "{out}");
        assert_eq!(err.trim_end(), want);
        // The same for a canister note.
        let (code, _, err) = extract(&["--path", "a.md", "--stored", &input], b"");
        assert_eq!((code, err.trim_end()), (Some(1), want.as_str()));
    }
}

#[test]
fn too_large_names_the_file_its_size_and_the_cap() {
    let dir = TempDir::new();
    let mut long_body = b"# heading\n".to_vec();
    long_body.resize(1_500_000, b'x');
    let long = dir.file("long.md", &long_body);
    let (code, _, err) = extract(&["--path", "a.md", s(&long)], b"");
    assert_eq!(code, Some(1));
    assert_eq!(
        err.trim_end(),
        format!(
            "error: {}: too large: the body is 1.5 MB (1,500,000 characters), over the \
             1,000,000-character body cap",
            s(&long)
        )
    );
    // Over the file cap, the file is not read through.
    let mut huge_body = b"# heading\n".to_vec();
    huge_body.resize(9_000_000, b'x');
    let huge = dir.file("huge.md", &huge_body);
    let (code, _, err) = extract(&["--path", "a.md", s(&huge)], b"");
    assert_eq!(code, Some(1));
    assert_eq!(
        err.trim_end(),
        format!(
            "error: {}: too large: 9.0 MB is over the 8 MiB (8,388,608-byte) file cap",
            s(&huge)
        )
    );
    let (code, _, err) = extract(&["--path", "a.md", "-"], &huge_body);
    assert_eq!(code, Some(1));
    assert!(
        err.starts_with("error: standard input: too large: more than 8.4 MB is over the 8 MiB"),
        "{err}"
    );
    // In a manifest the row says only the class.
    let manifest = dir.file(
        "notes.tsv",
        b"id\tpath\tfile\n1\tlong.md\tlong.md\n2\thuge.md\thuge.md\n",
    );
    let (code, out, _) = extract(&["--manifest", s(&manifest)], b"");
    assert_eq!(code, Some(0));
    assert_eq!(
        out,
        "{\"id\":\"1\",\"ok\":false,\"error\":\"too_large\"}\n\
         {\"id\":\"2\",\"ok\":false,\"error\":\"too_large\"}\n"
    );
}

#[test]
fn a_dash_reads_standard_input() {
    let dir = TempDir::new();
    let raw = b"---\ntitle: T\n---\n# One\n## Two\n";
    let file = dir.file("note.md", raw);
    let (code, from_file, err) = extract(&["--path", "inbox/note.md", s(&file)], b"");
    assert_eq!(code, Some(0), "{err}");
    let (code, from_stdin, err) = extract(&["--path", "inbox/note.md", "-"], raw);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(from_stdin, from_file);
    assert!(
        from_file.contains("\"heading_text\":\"Two\""),
        "{from_file}"
    );

    let note = br##"{"path":"inbox/note.md","frontmatter":"title: T","body":"# One\n## Two"}"##;
    let stored = dir.file("note.json", note);
    let (code, from_file, err) = extract(&["--path", "inbox/note.md", "--stored", s(&stored)], b"");
    assert_eq!(code, Some(0), "{err}");
    let (code, from_stdin, err) = extract(&["--path", "inbox/note.md", "--stored", "-"], note);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(from_stdin, from_file);
}

#[test]
fn surface_without_stored_is_a_usage_error() {
    let dir = TempDir::new();
    let file = dir.file("note.md", b"# One\n");
    let manifest = dir.file("notes.tsv", b"id\tpath\tfile\n1\tnote.md\tnote.md\n");
    for args in [
        vec!["--path", "note.md", "--surface", "rest", s(&file)],
        vec!["--surface", "mcp", "--manifest", s(&manifest)],
    ] {
        let (code, out, err) = extract(&args, b"");
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(out.is_empty());
        assert!(
            err.starts_with("error: --surface applies to --stored only"),
            "{err}"
        );
        assert!(err.contains("Usage: knowtation-sidecar extract"), "{err}");
    }
    let (code, _, err) = extract(
        &["--path", "note.md", "--surface", "rest", "--stored", "-"],
        br##"{"body":"# One"}"##,
    );
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_stored_body_that_is_not_a_string_says_so() {
    let (code, out, err) = extract(
        &["--path", "a.md", "--stored", "-", "--surface", "rest"],
        br##"{"body":["# One","# Two"]}"##,
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"heading_text\":\"One,# Two\""), "{out}");
    assert_eq!(
        err.trim_end(),
        "warning: standard input: the note's `body` is an array, not a string; it is read \
         as the gateway reads it, converted with String()"
    );
    let (code, out, err) = extract(
        &["--path", "a.md", "--stored", "-"],
        br#"{"body":{"toString":1}}"#,
    );
    assert_eq!(code, Some(1));
    assert!(out.is_empty());
    assert_eq!(
        err.trim_end(),
        "error: standard input: the note's `body` is not a string and cannot be converted \
         to one"
    );
    let (code, _, err) = extract(&["--path", "a.md", "--stored", "-"], b"<html>");
    assert_eq!(
        (code, err.trim_end()),
        (Some(1), "error: standard input: not a note: not JSON")
    );
}

#[test]
fn manifest_errors_carry_the_error_prefix() {
    let dir = TempDir::new();
    dir.file("one.md", b"# One\n");
    let manifest = dir.file(
        "notes.tsv",
        b"id\tpath\tfile\n1\tone.md\tone.md\n2\ttwo.md\n",
    );
    let (code, out, err) = extract(&["--manifest", s(&manifest)], b"");
    assert_eq!(code, Some(1));
    assert!(out.starts_with("{\"id\":\"1\",\"ok\":true"), "{out}");
    assert_eq!(
        err.trim_end(),
        format!(
            "error: manifest {} line 3: expected 3 columns, found 2",
            s(&manifest)
        )
    );
    let missing = dir.0.join("none.tsv");
    let (code, _, err) = extract(&["--manifest", s(&missing)], b"");
    assert_eq!(code, Some(1));
    assert_eq!(
        err.trim_end(),
        format!("error: manifest {}: no such file", s(&missing))
    );
    let header = dir.file("header.tsv", b"id\tfile\n");
    let (_, _, err) = extract(&["--manifest", s(&header)], b"");
    assert_eq!(
        err.trim_end(),
        format!(
            "error: manifest {}: header lacks the `path` column (need id, path, file)",
            s(&header)
        )
    );
}
