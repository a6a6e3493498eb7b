//! Replays every committed fuzz input through the checks the fuzz targets run
//! (`knowtation_sidecar::testkit::fuzz`), on the stable toolchain: the minimized corpora
//! in `fuzz/corpus/<target>/` and the crash inputs kept in `fuzz/regressions/<target>/`.
//! A failure names the target and the file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use knowtation_sidecar::testkit::fuzz;

type Check = fn(&[u8]);

/// Every fuzz target, by its name in `fuzz/Cargo.toml`.
const TARGETS: &[(&str, Check)] = &[
    ("path", fuzz::path),
    ("query", fuzz::query),
    ("route", fuzz::route),
    ("mcp_door", fuzz::mcp_door),
    ("tools_list", fuzz::tools_list),
    ("frontmatter", fuzz::frontmatter),
    ("extract", fuzz::extract),
    ("views", fuzz::views),
    ("upstream_wire", fuzz::upstream_wire),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The fewest inputs each target's minimized corpus may hold: a little under what is
/// committed, so a corpus that went missing or was cut down fails instead of replaying
/// nothing.
const MIN_CORPUS: &[(&str, usize)] = &[
    ("path", 400),
    ("query", 400),
    ("route", 1_100),
    ("mcp_door", 2_500),
    ("tools_list", 2_900),
    ("frontmatter", 5_700),
    ("extract", 6_100),
    ("upstream_wire", 1_600),
];

/// The crash inputs kept per target: exactly these folders, each with at least this many.
const REGRESSIONS: &[(&str, usize)] = &[("route", 7), ("tools_list", 10)];

/// The files of `dir`, sorted; a folder that cannot be read fails the test.
fn files(dir: &Path) -> Vec<PathBuf> {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{} cannot be read: {e}", dir.display()));
    let mut out: Vec<PathBuf> = entries
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

/// Runs `check` on every file of `dir`; returns how many ran and the failures.
fn replay(target: &str, check: Check, dir: &Path) -> (usize, Vec<String>) {
    let mut failures = Vec::new();
    let all = files(dir);
    for file in &all {
        let data = std::fs::read(file).expect("read a corpus file");
        if catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
            failures.push(format!("{target}: {}", file.display()));
        }
    }
    (all.len(), failures)
}

/// Replays the corpus (which must not be empty) and the regressions of one target.
fn replay_target(target: &str) {
    let check = TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, check)| *check)
        .expect("a listed target");
    let least = |table: &[(&str, usize)]| {
        table
            .iter()
            .find(|(name, _)| *name == target)
            .map_or(0, |(_, n)| *n)
    };
    let (n, mut failures) = replay(target, check, &fuzz_dir().join("corpus").join(target));
    assert!(
        n >= least(MIN_CORPUS).max(1),
        "fuzz/corpus/{target} holds {n} inputs, fewer than {}",
        least(MIN_CORPUS)
    );
    let kept = least(REGRESSIONS);
    if kept > 0 {
        let (n, mut more) = replay(target, check, &fuzz_dir().join("regressions").join(target));
        assert!(
            n >= kept,
            "fuzz/regressions/{target} holds {n} inputs, fewer than {kept}"
        );
        failures.append(&mut more);
    }
    assert!(
        failures.is_empty(),
        "failing inputs:\n{}",
        failures.join("\n")
    );
}

/// One test per target, so a failure names it and one target can be replayed alone
/// (`cargo test --test fuzz_corpus tools_list`).
macro_rules! replay_tests {
    ($($target:ident),* $(,)?) => {
        $(
            #[test]
            fn $target() {
                replay_target(stringify!($target));
            }
        )*
    };
}

replay_tests!(
    path,
    query,
    route,
    mcp_door,
    tools_list,
    frontmatter,
    extract,
    views,
    upstream_wire
);

/// Every folder of crash inputs belongs to a target and is listed in `REGRESSIONS`, so
/// none is skipped, and every listed one exists.
#[test]
fn every_folder_of_crash_inputs_is_replayed() {
    let mut folders: Vec<String> = std::fs::read_dir(fuzz_dir().join("regressions"))
        .expect("fuzz/regressions")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    folders.sort();
    let mut listed: Vec<String> = REGRESSIONS.iter().map(|(t, _)| (*t).to_owned()).collect();
    listed.sort();
    assert_eq!(folders, listed, "fuzz/regressions/ and REGRESSIONS differ");
    for (target, _) in REGRESSIONS.iter().chain(MIN_CORPUS) {
        assert!(
            TARGETS.iter().any(|(name, _)| name == target),
            "{target} is not a target"
        );
    }
    assert_eq!(MIN_CORPUS.len(), TARGETS.len());
}

#[test]
fn every_target_has_a_dictionary_and_a_binary() {
    assert_eq!(
        TARGETS.len(),
        9,
        "a target added here needs a replay test above"
    );
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    for (target, _) in TARGETS {
        assert!(
            fuzz_dir()
                .join("dicts")
                .join(format!("{target}.dict"))
                .is_file(),
            "fuzz/dicts/{target}.dict missing"
        );
        assert!(
            manifest.contains(&format!("name = \"{target}\"")),
            "{target} not in fuzz/Cargo.toml"
        );
    }
}
