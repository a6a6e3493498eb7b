//! The configuration explains itself, through the built binary: `check-config` refuses
//! exactly what `serve` refuses before binding, with the same message, and prints the
//! warnings `serve` logs at start; every message is in the words of the file (the key,
//! what was expected as a TOML value, the values allowed, the file a syntax error is in),
//! never in the schema's Rust types.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_knowtation-sidecar");
const GATEWAY: &str = "[upstream]\ngateway_url = \"http://127.0.0.1:9\"\n";

/// A fresh directory under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ks-config-msg-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn file(&self, name: &str, contents: &str) -> PathBuf {
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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `check-config` on `toml` (written to a file in `dir`): (exit code, stderr).
fn check(dir: &TempDir, toml: &str) -> (Option<i32>, String) {
    let config = dir.file("config.toml", toml);
    let out = Command::new(BIN)
        .args(["check-config", "--config", config.to_str().unwrap()])
        .env_clear()
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8(out.stderr).unwrap())
}

/// `serve` on `toml`: (exit code, stderr) once it exits by itself, or once it logged
/// `started` and was then stopped with SIGTERM.
fn serve(dir: &TempDir, toml: &str) -> (Option<i32>, String) {
    let config = dir.file("serve.toml", toml);
    let mut child = Command::new(BIN)
        .args(["serve", "--config", config.to_str().unwrap()])
        .env_clear()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let text = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&text);
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let t0 = Instant::now();
    let mut stopped = false;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        let started = String::from_utf8_lossy(&text.lock().unwrap()).contains(" started");
        if !stopped && (started || t0.elapsed() > Duration::from_secs(20)) {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            stopped = true;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    reader.join().unwrap();
    let text = String::from_utf8(text.lock().unwrap().clone()).unwrap();
    (status.code(), text)
}

/// The `error:` lines of a run's stderr.
fn errors(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect()
}

/// Listen and admin on free loopback ports, plain logs, no grace: a config `serve` can
/// start with; `listen` and `upstream` go into those tables, `extra` after.
fn runnable_with(listen: &str, upstream: &str, extra: &str) -> String {
    format!(
        "{GATEWAY}{upstream}[listen]\naddress = \"127.0.0.1:{}\"\n{listen}[admin]\n\
         address = \"127.0.0.1:{}\"\n[shutdown]\ngrace_seconds = 0\n[log]\n\
         format = \"plain\"\n{extra}",
        free_port(),
        free_port()
    )
}

fn runnable(extra: &str) -> String {
    runnable_with("", "", extra)
}

/// Whatever `serve` refuses before it binds, `check-config` refuses too, with the same
/// message: files it reads, the state directory it must be able to create (which the
/// check creates and removes again).
#[test]
fn check_config_refuses_what_serve_refuses_with_the_same_message() {
    let dir = TempDir::new();
    let missing = dir.0.join("missing.pem");
    let not_a_policy = dir.file("policy.toml", "default = \"maybe\"\n");
    let a_file = dir.file("a-file", "x");
    let cases = [
        (
            "state.directory",
            runnable(&format!(
                "[state]\ndirectory = {:?}\n",
                a_file.join("sessions")
            )),
        ),
        (
            "state.directory",
            runnable("[state]\ndirectory = \"/proc/self/no-such-dir/sessions\"\n"),
        ),
        (
            "mcp.policy_file",
            runnable(&format!("[mcp]\npolicy_file = {not_a_policy:?}\n")),
        ),
        (
            "mcp.policy_file",
            runnable(&format!("[mcp]\npolicy_file = {missing:?}\n")),
        ),
        (
            "listen.tls_cert_file",
            runnable_with(
                &format!("tls_cert_file = {missing:?}\ntls_key_file = {missing:?}\n"),
                "",
                "",
            ),
        ),
        (
            "upstream.ca_file",
            runnable_with("", &format!("ca_file = {missing:?}\n"), ""),
        ),
    ];
    for (key, toml) in cases {
        let (check_code, check_err) = check(&dir, &toml);
        let (serve_code, serve_err) = serve(&dir, &toml);
        assert_eq!(check_code, Some(64), "check-config on {key}: {check_err}");
        assert_eq!(serve_code, Some(64), "serve on {key}: {serve_err}");
        let check_errors = errors(&check_err);
        assert_eq!(check_errors.len(), 1, "{check_err}");
        assert!(
            check_errors[0].starts_with(&format!("error: invalid configuration: {key}: ")),
            "{check_err}"
        );
        assert_eq!(check_errors, errors(&serve_err), "{key}");
    }
    // A state directory that does not exist yet passes, and the check leaves nothing
    // behind: not the directory, not the parents it needed.
    let state = dir.0.join("new-parent").join("sessions");
    let (code, stderr) = check(&dir, &format!("{GATEWAY}[state]\ndirectory = {state:?}\n"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!dir.0.join("new-parent").exists());
}

/// The warnings `serve` logs at start are the ones `check-config` prints, key for key.
#[test]
fn check_config_prints_the_start_warnings() {
    let dir = TempDir::new();
    let toml = runnable("[intercept]\nmode = \"shadow\"\n");
    let (code, check_err) = check(&dir, &toml);
    assert_eq!(code, Some(0), "{check_err}");
    let (_, serve_err) = serve(&dir, &toml);
    let keys = [
        "auth.jwt_secrets",
        "upstream.canister_url",
        "upstream.bridge_url",
        "intercept.mode",
    ];
    for key in keys {
        assert!(
            check_err
                .lines()
                .any(|l| l.starts_with(&format!("warning: {key}: "))),
            "check-config: no warning for {key}:\n{check_err}"
        );
        assert!(
            serve_err
                .lines()
                .any(|l| l.contains("WARN") && l.contains(&format!("key=\"{key}\""))),
            "serve: no warning for {key}:\n{serve_err}"
        );
    }
    let printed = check_err
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .count();
    let logged = serve_err
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("key=\""))
        .count();
    assert_eq!(printed, keys.len(), "{check_err}");
    assert_eq!(logged, keys.len(), "{serve_err}");
    assert!(
        check_err.contains(
            "warning: intercept.mode: shadow mode: the gateway answers the section-source surface: "
        ),
        "{check_err}"
    );
}

/// (the TOML after the gateway, the whole error line `check-config` must print).
fn message_cases(dir: &TempDir) -> Vec<(String, String)> {
    let policy = dir.file("bad-policy.toml", "default = \"maybe\"\n");
    let broken_policy = dir.file("broken-policy.toml", "[roles\n");
    let e = |key: &str, what: &str| format!("error: invalid configuration: {key}: {what}");
    vec![
        (
            "[listen]\nmax_headers = \"many\"\n".to_owned(),
            e(
                "listen.max_headers",
                "expected a whole number, 0 or more, found the string \"many\"",
            ),
        ),
        (
            "[listen]\nmax_headers = -1\n".to_owned(),
            e("listen.max_headers", "expected a whole number, 0 or more, found -1"),
        ),
        (
            "[auth]\nrequire_exp = \"yes\"\n".to_owned(),
            e(
                "auth.require_exp",
                "expected true or false, found the string \"yes\"",
            ),
        ),
        (
            "[cors]\nallowed_origins = \"https://hub.example\"\n".to_owned(),
            e(
                "cors.allowed_origins",
                "expected a list, such as [\"a\", \"b\"], found the string \"https://hub.example\"",
            ),
        ),
        (
            "[log]\nformat = \"xml\"\n".to_owned(),
            e("log.format", "must be one of \"json\", \"plain\" (found \"xml\")"),
        ),
        (
            "[hosted_context]\non_failure = \"allow\"\n".to_owned(),
            e(
                "hosted_context.on_failure",
                "must be one of \"deny\", \"actor\" (found \"allow\")",
            ),
        ),
        (
            "[log]\nlevel = \"warning\"\n".to_owned(),
            e(
                "log.level",
                "must be one of \"trace\", \"debug\", \"info\", \"warn\", \"error\", \"off\", \
                 or comma-separated target=level directives (found \"warning\")",
            ),
        ),
        (
            "[auth]\njwt_secrets = \"LEAK-0123456789abcdef0123456789abcdef\"\n".to_owned(),
            e(
                "auth.jwt_secrets",
                "must be a list of strings, such as jwt_secrets = [\"<current>\", \
                 \"<previous>\"] (or set auth.jwt_secrets_file, one secret per line); the \
                 value is not shown because it is a secret",
            ),
        ),
        (
            "[listen]\naddress = \"localhost:8080\"\n".to_owned(),
            e(
                "listen.address",
                "not an address: expected IP:PORT, such as \"0.0.0.0:8080\", \
                 \"127.0.0.1:9901\" or \"[::]:8080\" (an IP address, not a host name)",
            ),
        ),
        (
            "[admin]\naddress = \"9901\"\n".to_owned(),
            e(
                "admin.address",
                "not an address: expected IP:PORT, such as \"0.0.0.0:8080\", \
                 \"127.0.0.1:9901\" or \"[::]:8080\" (an IP address, not a host name)",
            ),
        ),
        (
            "[cors]\nallowed_origins = [\"https://hub.example/\"]\n".to_owned(),
            e(
                "cors.allowed_origins",
                "origin #1 \"https://hub.example/\" is not an origin: expected \
                 scheme://host[:port], such as \"https://hub.example\", with no path or \
                 trailing slash, which a browser's Origin never has",
            ),
        ),
        (
            "[cors]\nallowed_origins = [\"*\"]\n".to_owned(),
            e(
                "cors.allowed_origins",
                "origin #1 \"*\" is not an origin: expected scheme://host[:port], such as \
                 \"https://hub.example\", with no path or trailing slash, which a browser's \
                 Origin never has; leave the list empty to allow any origin (`*`)",
            ),
        ),
        (
            format!("[mcp]\npolicy_file = {policy:?}\n"),
            e(
                "mcp.policy_file",
                &format!(
                    "{}: invalid policy: default: must be one of \"allow\", \"deny\" (found \"maybe\")",
                    policy.display()
                ),
            ),
        ),
        (
            format!("[mcp]\npolicy_file = {broken_policy:?}\n"),
            e(
                "mcp.policy_file",
                &format!(
                    "{}: invalid policy: TOML parse error at line 1, column 7",
                    broken_policy.display()
                ),
            ),
        ),
        (
            "upstream = 5\n".to_owned(),
            e("upstream", "expected a table (a [section] of keys), found 5"),
        ),
    ]
}

#[test]
fn messages_are_in_the_words_of_the_file() {
    let dir = TempDir::new();
    for (extra, want) in message_cases(&dir) {
        let toml = if extra.starts_with("upstream = ") {
            extra.clone()
        } else {
            format!("{GATEWAY}{extra}")
        };
        let (code, stderr) = check(&dir, &toml);
        assert_eq!(code, Some(64), "{extra}: {stderr}");
        let first = errors(&stderr).first().copied().unwrap_or_default();
        assert_eq!(first, want, "{extra}");
        for rust in [
            "usize",
            "u64",
            "struct ",
            "sequence",
            "variant",
            "signed int",
        ] {
            assert!(!stderr.contains(rust), "{rust} in: {stderr}");
        }
        assert!(!stderr.contains("LEAK"), "a secret in: {stderr}");
    }
}

#[test]
fn a_toml_syntax_error_names_the_file() {
    let dir = TempDir::new();
    let (code, stderr) = check(&dir, &format!("{GATEWAY}[listen\n"));
    assert_eq!(code, Some(64));
    let config = dir.0.join("config.toml");
    assert!(
        stderr.starts_with(&format!(
            "error: invalid configuration: {}: not valid TOML: TOML parse error at line 3, column 8",
            config.display()
        )),
        "{stderr}"
    );
}

/// Without `--config` and without the default file, the operator is told no file was
/// read, whether the result is valid or not.
#[test]
fn no_file_read_is_said() {
    if Path::new(knowtation_sidecar::config::DEFAULT_CONFIG_PATH).exists() {
        return; // this machine has one: the case cannot arise here
    }
    let note = "note: no configuration file was read (no --config given, and \
                /etc/knowtation-sidecar/config.toml does not exist): the built-in defaults \
                and KNOWTATION_SIDECAR_* variables only";
    let run = |env: &[(&str, &str)]| -> Output {
        let mut c = Command::new(BIN);
        c.arg("check-config").env_clear();
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let invalid = run(&[]);
    assert_eq!(invalid.status.code(), Some(64));
    let stderr = String::from_utf8(invalid.stderr).unwrap();
    assert_eq!(stderr.lines().next(), Some(note), "{stderr}");
    assert!(
        stderr.contains("upstream.gateway_url: required"),
        "{stderr}"
    );
    let valid = run(&[(
        "KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_URL",
        "http://127.0.0.1:9",
    )]);
    assert_eq!(valid.status.code(), Some(0));
    let stderr = String::from_utf8(valid.stderr).unwrap();
    assert!(stderr.lines().any(|l| l == note), "{stderr}");
    // With a file, no such note.
    let dir = TempDir::new();
    let (_, stderr) = check(&dir, GATEWAY);
    assert!(!stderr.contains("no configuration file"), "{stderr}");
}
