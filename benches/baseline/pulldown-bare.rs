//! The baseline of the `extract --manifest` benchmark: the same manifest TSV read the
//! same way, each file read and run through a bare pulldown-cmark pass (plain
//! CommonMark, with offsets, as the extractor parses), nothing else. Prints the number
//! of events so the pass cannot be optimized away.
//!
//! Usage: `pulldown-bare MANIFEST.tsv`

use std::path::Path;
use std::process::ExitCode;

use pulldown_cmark::{Options, Parser};

fn main() -> ExitCode {
    let Some(manifest) = std::env::args_os().nth(1) else {
        eprintln!("usage: pulldown-bare MANIFEST.tsv");
        return ExitCode::FAILURE;
    };
    let manifest = Path::new(&manifest);
    let Ok(text) = std::fs::read_to_string(manifest) else {
        eprintln!("cannot read {}", manifest.display());
        return ExitCode::FAILURE;
    };
    let base = manifest.parent().unwrap_or_else(|| Path::new("."));
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split('\t').collect();
    let Some(file_col) = header.iter().position(|c| *c == "file") else {
        eprintln!("the header lacks a `file` column");
        return ExitCode::FAILURE;
    };
    let mut events = 0usize;
    for line in lines {
        let Some(file) = line.split('\t').nth(file_col) else {
            continue;
        };
        if let Ok(note) = std::fs::read_to_string(base.join(file)) {
            events += Parser::new_ext(&note, Options::empty())
                .into_offset_iter()
                .count();
        }
    }
    println!("{events}");
    ExitCode::SUCCESS
}
