//! Replays every committed fuzz input through the checks the fuzz targets run
//! (`knowtation_testkit::fuzz`), on the stable toolchain: the minimized corpora
//! in `fuzz/corpus/<target>.tar.gz` and the crash inputs kept in
//! `fuzz/regressions/<target>/`.
//! A failure names the target and the file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use knowtation_testkit::fuzz;

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
    ("views", 80),
];

/// The crash inputs kept per target: exactly these folders, each with at least this many.
const REGRESSIONS: &[(&str, usize)] = &[("route", 7), ("tools_list", 10)];

/// The inputs of a target's corpus archive, `fuzz/corpus/<target>.tar.gz` (written by
/// `fuzz/corpus.sh pack`), by name; an archive that is missing or cannot be read fails
/// the test.
fn archive(target: &str) -> Vec<(String, Vec<u8>)> {
    let path = fuzz_dir().join("corpus").join(format!("{target}.tar.gz"));
    let file = std::fs::File::open(&path)
        .unwrap_or_else(|e| panic!("{} cannot be read: {e}", path.display()));
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut out = Vec::new();
    for entry in tar.entries().expect("a tar archive") {
        let mut entry = entry.expect("an archive entry");
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path().expect("an entry name").display().to_string();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).expect("an entry's bytes");
        out.push((name, data));
    }
    out
}

/// The files of `dir`, by name; a folder that cannot be read fails the test.
fn folder(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{} cannot be read: {e}", dir.display()));
    let mut out: Vec<(String, Vec<u8>)> = entries
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .map(|p| (p.display().to_string(), std::fs::read(&p).expect("a file")))
        .collect();
    out.sort();
    out
}

/// Runs `check` on every input; returns how many ran and the failures.
fn replay(target: &str, check: Check, inputs: &[(String, Vec<u8>)]) -> (usize, Vec<String>) {
    let mut failures = Vec::new();
    for (name, data) in inputs {
        if catch_unwind(AssertUnwindSafe(|| check(data))).is_err() {
            failures.push(format!("{target}: {name}"));
        }
    }
    (inputs.len(), failures)
}

/// Replays the corpus (which must hold its minimum) and the regressions of one target.
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
    let (n, mut failures) = replay(target, check, &archive(target));
    assert!(
        n >= least(MIN_CORPUS).max(1),
        "fuzz/corpus/{target}.tar.gz holds {n} inputs, fewer than {}",
        least(MIN_CORPUS)
    );
    let kept = least(REGRESSIONS);
    if kept > 0 {
        let dir = fuzz_dir().join("regressions").join(target);
        let (n, mut more) = replay(target, check, &folder(&dir));
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

/// The corpora are committed as archives only: a folder of loose inputs left in
/// `fuzz/corpus/` by a fuzzing run is git-ignored, and an archive per target exists.
#[test]
fn every_target_has_one_corpus_archive() {
    for (target, _) in TARGETS {
        let path = fuzz_dir().join("corpus").join(format!("{target}.tar.gz"));
        assert!(path.is_file(), "{} missing", path.display());
    }
    let ignore =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".gitignore")).unwrap();
    assert!(
        ignore.lines().any(|l| l.trim() == "/fuzz/corpus/*/"),
        "unpacked corpora must be git-ignored"
    );
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
