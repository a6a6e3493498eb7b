//! Extractor benchmarks.
//!
//! - `corpus/*`: real-world Markdown (see `benches/make-corpus.sh`): a bare pulldown-cmark
//!   pass over every file against the whole `extract --manifest` work (read, split, YAML,
//!   parse, build, serialize, write) over the same files, in this process.
//!   `EXTRACT_CORPUS` names another corpus directory (default `target/bench-corpus`).
//!   The target (at most 1.5) is measured on whole processes: the release binary against
//!   `benches/baseline/pulldown-bare.rs`, as `docs/benchmarks.md` shows.
//! - `pathological/*`: hostile inputs at the 1,000,000-unit cap; each must also finish
//!   within a generous bound, checked once before measuring.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use knowtation_sidecar::extract::{self, Frontmatter, Limits};
use knowtation_sidecar::path;
use pulldown_cmark::{Options, Parser};

#[path = "pathological_inputs.rs"]
mod pathological_inputs;

/// A hostile input at the cap must build within this, in a release build.
const PATHOLOGICAL_BOUND: Duration = Duration::from_secs(2);

fn corpus_dir() -> PathBuf {
    let dir = std::env::var_os("EXTRACT_CORPUS")
        .map_or_else(|| PathBuf::from("target/bench-corpus"), PathBuf::from);
    Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)
}

fn corpus_files() -> Vec<PathBuf> {
    let dir = corpus_dir().join("files");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|_| panic!("no corpus in {}: run benches/make-corpus.sh", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    files
}

fn corpus(c: &mut Criterion) {
    let files = corpus_files();
    let bytes: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let manifest = corpus_dir().join("manifest.tsv");
    let texts: Vec<String> = files
        .iter()
        .filter_map(|f| std::fs::read(f).ok())
        .filter_map(|b| String::from_utf8(b).ok())
        .collect();

    let mut g = c.benchmark_group("corpus");
    g.throughput(Throughput::Bytes(bytes));
    g.sample_size(30);
    // Baseline: read every file and run the bare parser over it, nothing else.
    g.bench_function("pulldown_bare", |b| {
        b.iter(|| {
            let mut events = 0usize;
            for f in &files {
                if let Ok(text) = std::fs::read_to_string(f) {
                    events += Parser::new_ext(&text, Options::empty()).count();
                }
            }
            black_box(events)
        })
    });
    // The whole `extract --manifest` work, output to a sink.
    g.bench_function("extract_manifest", |b| {
        b.iter(|| {
            let ok = knowtation_sidecar::cli::run_manifest(&manifest, &mut std::io::sink());
            black_box(ok.is_ok())
        })
    });
    // The extractor alone over in-memory texts (no I/O, no output).
    let p = path::validate("corpus/note.md").unwrap_or_else(|_| unreachable!());
    g.bench_function("extract_in_memory", |b| {
        b.iter(|| {
            for t in &texts {
                black_box(
                    extract::build_from_raw(&p, t, &Limits::default())
                        .map(|d| d.to_json())
                        .ok(),
                );
            }
        })
    });
    g.finish();
}

fn pathological(c: &mut Criterion) {
    let p = path::validate("p.md").unwrap_or_else(|_| unreachable!());
    let mut g = c.benchmark_group("pathological");
    g.sample_size(10);
    for (name, input) in pathological_inputs::cases(1_000_000) {
        let start = Instant::now();
        let result = extract::build(&p, &Frontmatter::default(), &input, &Limits::default());
        let took = start.elapsed();
        assert!(result.is_ok(), "{name}: rejected");
        assert!(
            took < PATHOLOGICAL_BOUND,
            "{name}: {took:?} is over the bound"
        );
        g.throughput(Throughput::Bytes(input.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                black_box(
                    extract::build(&p, &Frontmatter::default(), &input, &Limits::default()).ok(),
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, corpus, pathological);
criterion_main!(benches);
