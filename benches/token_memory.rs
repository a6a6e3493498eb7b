//! Memory of the verified-token cache (`auth.token_cache_entries`, default 1,024 per
//! surface) against tokens whose claims decode large. Run with
//! `cargo bench --bench token_memory` (`TOKEN_COUNT`, 1,024).
//!
//! A token's length does not bound what its claims cost once decoded: a payload of
//! 1,400 zeros fits a 4 KiB token and decodes to about 50 KiB of JSON values. So the
//! cache stores only claims whose estimated heap is at most 8 KiB, and the worst case is
//! about 8.25 KiB per entry. For each shape below, a fresh sidecar with its default
//! limits (but no per-user rate limit) is warmed up with 2,048 REST requests under one ordinary token; then
//! `TOKEN_COUNT` distinct tokens of the shape are each used twice. The report gives the
//! growth of the sidecar's RSS over that phase, per token, and how many second uses were
//! remembered rather than verified again.
//!
//! The mock upstreams run in this process; the sidecar is the release binary (`serve`).
//! Figures go to `docs/benchmarks.md` by hand, with the machine they came from.

// A benchmark harness: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use knowtation_testkit::{self as testkit, client};
use serde_json::{json, Value};

mod common;
use common::{binary, env_u64, mocks, status_kib, store_bench_note, Sidecar, Upstreams};

const SECRET: &str = "token-memory-bench-secret-0123456789";
const SECTION: &str = "/api/v1/section-source?path=projects/sidecar-rollout.md";

/// Claims for token `i` of a shape.
fn claims(shape: &str, i: u64, exp: u64) -> Value {
    let mut c = json!({"sub": format!("bench-{i:05}"), "exp": exp, "type": "session"});
    let pad = match shape {
        "ordinary" => return c,
        // 90 strings of 17 bytes: an estimate just under the 8 KiB limit, so stored.
        "at the limit" => json!((0..90).map(|j| format!("{j:017}")).collect::<Vec<_>>()),
        "1,400 zeros" => json!(vec![0; 1400]),
        "900 empty strings" => json!(vec![""; 900]),
        _ => unreachable!("unknown shape"),
    };
    c["pad"] = pad;
    c
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        // `cargo test --benches` and list requests: nothing to run here.
        return;
    }
    let count = env_u64("TOKEN_COUNT", 1024);
    let bin = binary();
    let (rt, gateway, canister, bridge) = mocks();
    let upstreams = Upstreams {
        gateway: &gateway.url(),
        canister: &canister.url(),
        bridge: &bridge.url(),
    };
    store_bench_note(&canister);
    let exp = testkit::unix_now() + 3600;
    println!("| tokens | shape | token bytes | RSS growth | per token | second uses remembered |");
    println!("|---|---|---|---|---|---|");
    for shape in [
        "ordinary",
        "at the limit",
        "1,400 zeros",
        "900 empty strings",
    ] {
        // The per-user rate limit would refuse the warm-up's 2,048 requests in a minute.
        let unlimited = [(
            "KNOWTATION_SIDECAR_RATE_LIMIT__PER_USER_PER_MINUTE",
            "0".to_owned(),
        )];
        let mut sidecar = Sidecar::start(&bin, &rt, upstreams, SECRET, &unlimited, &[]);
        let url = format!("http://{}{SECTION}", sidecar.addr);
        let get = |token: &str| {
            let bearer = format!("Bearer {token}");
            let headers = [
                ("Authorization", bearer.as_str()),
                ("X-Vault-Id", "default"),
            ];
            let response = rt.block_on(client::get(&url, &headers)).unwrap();
            assert_eq!(response.status, 200);
        };
        let warm = testkit::sign_token(SECRET, claims("ordinary", count + 1, exp));
        for _ in 0..2048 {
            get(&warm);
        }
        let remembered = || {
            let series =
                r#"knowtation_sidecar_tokens_verified_total{check="remembered",surface="rest"}"#;
            sidecar.metric(&rt, series)
        };
        let before_kib = status_kib(sidecar.pid(), "VmRSS");
        let remembered_before = remembered();
        let tokens: Vec<String> = (0..count)
            .map(|i| testkit::sign_token(SECRET, claims(shape, i, exp)))
            .collect();
        for token in &tokens {
            get(token);
        }
        for token in &tokens {
            get(token);
        }
        let grown_kib = status_kib(sidecar.pid(), "VmRSS").saturating_sub(before_kib);
        println!(
            "| {count} | {shape} | {} | {:.1} MiB | {:.2} KiB | {} of {count} |",
            tokens[0].len(),
            grown_kib as f64 / 1024.0,
            grown_kib as f64 / count as f64,
            remembered() - remembered_before,
        );
        sidecar.stop();
    }
}
