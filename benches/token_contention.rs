//! Contention on the verified-token cache when several runtime threads verify at once
//! (`runtime.threads > 1`). Run with `cargo bench --bench token_contention`
//! (`CONTENTION_MILLIS`, 2,000 per row).
//!
//! The cache is one mutex per key set, held for a map lookup and a reference-count
//! increment. Each row runs some threads that do nothing but verify remembered tokens
//! through [`auth::verify_token`], as a request does (digest, lookup, time checks), for
//! the same wall time, and reports verifications per second in all and the time each
//! took. That is a worst case: a request spends about 0.2 µs of its 20–35 µs of CPU in
//! the cache, so two threads serving requests meet at the lock far less often than
//! here. One token shared by every thread is the worst of it (the claims' reference
//! count moves between cores too); a token per thread shares only the lock.
//!
//! Figures go to `docs/benchmarks.md` by hand, with the machine they came from.

// A benchmark harness: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Barrier;
use std::time::{Duration, Instant};

use knowtation_sidecar::auth::{self, Keys};
use knowtation_testkit as testkit;

// Only the environment helper is used here; the rest serves the load benchmarks.
#[allow(dead_code)]
mod common;
use common::env_u64;

const SECRET: &str = "token-contention-bench-secret-0123";

/// Verifications per thread between two looks at the clock.
const BATCH: u64 = 1_000;

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        // `cargo test --benches` and list requests: nothing to run here.
        return;
    }
    let run = Duration::from_millis(env_u64("CONTENTION_MILLIS", 2_000));
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!("{cores} cores; {} ms per row", run.as_millis());
    println!("| threads | tokens | verifications/s | per verification, each thread | against one thread |");
    println!("|---|---|---|---|---|");
    let mut alone = 0.0;
    for (threads, shared) in [(1, true), (2, true), (2, false), (4, true), (4, false)] {
        let rate = row(threads, shared, run);
        if threads == 1 {
            alone = rate;
        }
        let per = Duration::from_secs_f64(threads as f64 / rate);
        println!(
            "| {threads} | {} | {:.2} M | {:.0} ns | {:.2}× |",
            if shared {
                "one shared"
            } else {
                "one per thread"
            },
            rate / 1e6,
            per.as_nanos(),
            rate / alone,
        );
    }
}

/// Verifications per second of `threads` threads over `run`.
fn row(threads: usize, shared: bool, run: Duration) -> f64 {
    let keys = Keys::from_secrets([SECRET], true);
    let tokens: Vec<String> = (0..threads)
        .map(|i| {
            let sub = if shared { 0 } else { i };
            let claims =
                testkit::session_claims(&format!("bench-{sub}"), Duration::from_secs(3600));
            format!("Bearer {}", testkit::sign_token(SECRET, claims))
        })
        .collect();
    let now = testkit::unix_now();
    for token in &tokens {
        // The first verification decodes and remembers; the timed ones find it.
        auth::verify_token(Some(token), &keys, now).expect("token");
    }
    let start = Barrier::new(threads);
    let done: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = tokens
            .iter()
            .map(|token| {
                let (keys, start) = (&keys, &start);
                s.spawn(move || {
                    start.wait();
                    let began = Instant::now();
                    let mut count = 0;
                    while began.elapsed() < run {
                        for _ in 0..BATCH {
                            let verified = auth::verify_token(Some(token), keys, now);
                            assert!(verified.is_ok_and(|v| v.remembered()));
                        }
                        count += BATCH;
                    }
                    count
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("worker")).sum()
    });
    done as f64 / run.as_secs_f64()
}
