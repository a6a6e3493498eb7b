//! The crate graph is the architecture, and the compiler keeps it so only where the
//! manifests say so: this test reads the workspace's resolved graph (`cargo metadata`)
//! and checks the directions the README's layout promises.
//!
//! - the views crate depends on no other crate of the workspace;
//! - the mock upstreams depend on no other crate of the workspace (a stand-in built from
//!   the sidecar's own code would agree with it by construction);
//! - the test kit is reached from the daemon only through dev-dependencies: the graph of
//!   normal dependencies the release binary is built from does not contain it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeSet, HashMap};
use std::process::Command;

use serde_json::Value;

const DAEMON: &str = "knowtation-sidecar";
const VIEWS: &str = "knowtation-views";
const MOCKS: &str = "knowtation-mock-upstream";
const TESTKIT: &str = "knowtation-testkit";

/// The resolved graph: package name → (dependency name, whether any of its uses is a
/// normal dependency).
fn graph() -> HashMap<String, Vec<(String, bool)>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect();
    meta["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| {
            let deps = node["deps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    let normal = d["dep_kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|k| k["kind"].is_null());
                    (names[d["pkg"].as_str().unwrap()].to_owned(), normal)
                })
                .collect();
            (names[node["id"].as_str().unwrap()].to_owned(), deps)
        })
        .collect()
}

/// Every package reachable from `root` through normal dependencies, `root` included.
fn normal_closure(graph: &HashMap<String, Vec<(String, bool)>>, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::from([root.to_owned()]);
    let mut todo = vec![root.to_owned()];
    while let Some(p) = todo.pop() {
        for (dep, normal) in &graph[&p] {
            if *normal && seen.insert(dep.clone()) {
                todo.push(dep.clone());
            }
        }
    }
    seen
}

fn workspace_deps(graph: &HashMap<String, Vec<(String, bool)>>, name: &str) -> Vec<String> {
    graph[name]
        .iter()
        .map(|(d, _)| d.clone())
        .filter(|d| d.starts_with("knowtation-"))
        .collect()
}

#[test]
fn the_views_crate_depends_on_no_other_crate_of_the_workspace() {
    let g = graph();
    assert_eq!(workspace_deps(&g, VIEWS), Vec::<String>::new());
    // Pure: no async runtime, no HTTP types, anywhere below it.
    let below = normal_closure(&g, VIEWS);
    for heavy in ["tokio", "hyper", "http", "rustls"] {
        assert!(!below.contains(heavy), "{VIEWS} reaches {heavy}");
    }
}

#[test]
fn the_mock_upstreams_depend_on_no_other_crate_of_the_workspace() {
    let g = graph();
    assert_eq!(workspace_deps(&g, MOCKS), Vec::<String>::new());
}

#[test]
fn the_release_binary_carries_no_test_support() {
    let g = graph();
    let shipped = normal_closure(&g, DAEMON);
    assert!(shipped.contains(VIEWS) && shipped.contains(MOCKS));
    assert!(
        !shipped.contains(TESTKIT),
        "{TESTKIT} is linked into the binary"
    );
    for (name, deps) in &g {
        for (dep, normal) in deps {
            assert!(
                !(dep == TESTKIT && *normal),
                "{name} depends on {TESTKIT} outside its tests"
            );
        }
    }
    // The test kit is there for the tests: the daemon reaches it as a dev-dependency.
    assert!(g[DAEMON].iter().any(|(d, normal)| d == TESTKIT && !normal));
}
