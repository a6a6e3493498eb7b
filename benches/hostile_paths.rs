//! The route classifier on hostile request paths. Run with `cargo bench --bench
//! hostile_paths`; `HOSTILE_ONLY=<fragment>` runs only the rows whose name has it.
//!
//! Every request's path is classified before anything else, unauthenticated, and a
//! request line may be as long as the head limit (64 KiB). Each row is a path of about
//! 65,000 bytes shaped against one part of the classifier (the name searches, the
//! normalization, the escape decoding, the prefix); two rows stay just under the 1 KiB
//! up to which every reading of a path is worked out. Each row reports the time of one
//! classification: the median of 7 batches, on one thread. Ordinary paths close the
//! table for scale. Figures go to `docs/benchmarks.md` by hand, with the machine they
//! came from.

// A benchmark harness: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Instant;

use knowtation_sidecar::route;

/// Bytes in each long path: the head limit less the rest of a request line.
const LONG: usize = 65_000;

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        // `cargo test --benches` and list requests: nothing to run here.
        return;
    }
    let n = LONG;
    let rows: Vec<(&str, String)> = vec![
        ("segments of one letter", format!("/{}", "a/".repeat(n / 2))),
        (
            "segments, then the REST route and `//`",
            format!("/{}section-source//", "a/".repeat(n / 2 - 10)),
        ),
        ("one letter", format!("/{}", "s".repeat(n))),
        (
            "a handler name's prefix",
            format!("/{}", "section".repeat(n / 7)),
        ),
        (
            "one segment naming `mcp`, then `..`",
            format!("/{}mcp/..", "m".repeat(n)),
        ),
        ("unreserved escapes", format!("/{}mcp", "%41".repeat(n / 3))),
        (
            "escaped slashes, decoded by a hop, then `mcp`",
            format!("/{}mcp", "%2F".repeat(n / 3)),
        ),
        (
            "escaped escapes (`%25`), then `mcp` and `..`",
            format!("/{}mcp/..", "%2525".repeat(n / 5)),
        ),
        (
            "escaped backslashes and `?`, then `mcp`",
            format!("/mcp{}", "%5C%3F".repeat(n / 6)),
        ),
        (
            "empty segments, then `mcp`",
            format!("/{}mcp", "/".repeat(n)),
        ),
        (
            "`.` segments, then `mcp`",
            format!("/{}mcp", "./".repeat(n / 2)),
        ),
        (
            "gateway prefixes, then `mcp`",
            format!("{}/mcp", "/.netlify/functions/gateway".repeat(n / 27)),
        ),
        (
            "within the search bound: prefixes, `//` and `..` mixed",
            format!("{}/mcp", "/.netlify/functions/gateway//..".repeat(31)),
        ),
        (
            "within the search bound: `/./` and `//` mixed",
            format!("/x{}/mcp", "/.//..//a".repeat(110)),
        ),
        (
            "within the search bound: escaped slashes, `.` and `..` mixed",
            format!("/x{}/mcp", "%2F.%2F..%2F%2Fa".repeat(60)),
        ),
        (
            "ordinary: the REST route",
            "/api/v1/section-source".to_owned(),
        ),
        (
            "ordinary: another route",
            "/api/v1/notes/projects%2Fa.md".to_owned(),
        ),
    ];
    println!("| path | bytes | one classification |");
    println!("|---|---|---|");
    // `HOSTILE_ONLY`: only the rows whose name contains it (for a profiler).
    let only = std::env::var("HOSTILE_ONLY").unwrap_or_default();
    for (name, path) in rows.into_iter().filter(|(name, _)| name.contains(&only)) {
        let uri: http::Uri = path.parse().expect("a valid path");
        let reps = if path.len() > 1_000 { 200 } else { 200_000 };
        let mut batches: Vec<f64> = (0..7)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..reps {
                    black_box(route::routes(black_box(&uri)));
                }
                start.elapsed().as_secs_f64() * 1e6 / f64::from(reps)
            })
            .collect();
        batches.sort_by(f64::total_cmp);
        println!("| {name} | {} | {:.2} µs |", path.len(), batches[3]);
    }
}
