//! The built binary: `check-config` and `serve` with valid and invalid configurations.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_knowtation-sidecar");

/// A file in the temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(contents: &str) -> TempFile {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "ks-cli-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The binary with only the given environment (nothing inherited leaks in).
fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args).env_clear();
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    command(args, env).output().expect("binary runs")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn check_config_prints_toml_with_secrets_redacted() {
    let secrets = TempFile::new("jwt-from-file-AAAA\n");
    let gw_secret = TempFile::new("gw-from-file-BBBB\n");
    let config = TempFile::new(&format!(
        "[upstream]\ngateway_url = \"http://127.0.0.1:3000\"\ngateway_secret_file = {:?}\n\
         [auth]\njwt_secrets_file = {:?}\n",
        gw_secret.0, secrets.0
    ));
    let path = config.0.to_str().unwrap();
    let out = run(
        &["check-config", "--config", path],
        &[
            ("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", "jwt-from-env-CCCC"),
            (
                "KNOWTATION_SIDECAR_CORS__ALLOWED_ORIGINS",
                "https://hub.example, https://www.hub.example",
            ),
            ("KNOWTATION_SIDECAR_LISTEN__MAX_HEADERS", "50"),
        ],
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stderr}");
    for secret in ["AAAA", "BBBB", "CCCC"] {
        assert!(!stdout.contains(secret), "secret in stdout:\n{stdout}");
        assert!(!stderr.contains(secret), "secret in stderr:\n{stderr}");
    }
    assert!(
        stdout.contains("gateway_secret = \"<redacted>\""),
        "{stdout}"
    );
    assert!(
        stdout.contains("jwt_secrets = [\"<redacted>\", \"<redacted>\"]"),
        "{stdout}"
    );
    assert!(
        stdout.contains(r#"allowed_origins = ["https://hub.example", "https://www.hub.example"]"#),
        "{stdout}"
    );
    assert!(stdout.contains("max_headers = 50"), "{stdout}");
    assert!(stdout.contains("[hosted_context]"), "{stdout}");
    // Every key is shown, unset ones as comments.
    for unset in [
        "# canister_url = unset",
        "# bridge_url = unset",
        "# directory = unset",
        "# policy_file = unset",
    ] {
        assert!(stdout.contains(unset), "{unset} missing:\n{stdout}");
    }

    // A secret that fails validation is still not echoed.
    let out = run(
        &["check-config", "--config", path],
        &[("KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_SECRET", "DDDD")],
    );
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("upstream.gateway_secret_file"), "{stderr}");
    assert!(
        !stderr.contains("DDDD") && !stderr.contains("BBBB"),
        "{stderr}"
    );
}

#[test]
fn invalid_config_exits_64_naming_the_key() {
    let valid = "[upstream]\ngateway_url = \"http://127.0.0.1:3000\"\n";
    /// (config file, environment, the key the error must name)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case<'_>] = &[
        ("[log]\nlevel = \"info\"\n", &[], "upstream.gateway_url"),
        ("[upstream]\ngateway_url = \"ftp://x\"\n", &[], "upstream.gateway_url"),
        (valid, &[("KNOWTATION_SIDECAR_HOSTED_CONTEXT__TIMEOUT_MS", "100")], "hosted_context.timeout_ms"),
        (valid, &[("KNOWTATION_SIDECAR_LISTEN__MAX_IN_FLIGHT", "0")], "listen.max_in_flight"),
        (valid, &[("KNOWTATION_SIDECAR_LISTEN__NO_SUCH", "1")], "KNOWTATION_SIDECAR_LISTEN__NO_SUCH"),
        (valid, &[("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", "a,b,c")], "auth.jwt_secrets"),
        // A typo the filter syntax would take for a target name, silencing every line.
        (valid, &[("KNOWTATION_SIDECAR_LOG__LEVEL", "warning")], "log.level"),
        (valid, &[("KNOWTATION_SIDECAR_LOG__LEVEL", "info,hyper=loud")], "log.level"),
        (valid, &[("KNOWTATION_SIDECAR_LOG__ACCESS", "some")], "log.access"),
        // Ranges that no hop count would read, a range that is not one, too many hops.
        (valid, &[("KNOWTATION_SIDECAR_FORWARDED__TRUSTED_PROXIES", "10.0.0.0/8")], "forwarded.trusted_hops"),
        (valid, &[("KNOWTATION_SIDECAR_FORWARDED__TRUSTED_HOPS", "1"), ("KNOWTATION_SIDECAR_FORWARDED__TRUSTED_PROXIES", "10.0.0.0/8,lb")], "forwarded.trusted_proxies"),
        (valid, &[("KNOWTATION_SIDECAR_FORWARDED__TRUSTED_HOPS", "17")], "forwarded.trusted_hops"),
        ("[upstream]\ngateway_url = \"http://x\"\nsurprise = true\n", &[], "upstream.surprise"),
        (
            "[upstream]\ngateway_url = \"http://x\"\n[listen]\ntls_cert_file = \"/nonexistent.pem\"\n",
            &[],
            "listen.tls_key_file",
        ),
        // Files are read when the runtime objects are built, still before any port.
        (
            "[upstream]\ngateway_url = \"http://x\"\nca_file = \"/nonexistent.pem\"\n",
            &[],
            "upstream.ca_file",
        ),
        (
            "[upstream]\ngateway_url = \"http://x\"\n[listen]\ntls_cert_file = \"/nonexistent.pem\"\ntls_key_file = \"/nonexistent.pem\"\n",
            &[],
            "listen.tls_cert_file",
        ),
        (
            "[upstream]\ngateway_url = \"http://x\"\n[mcp]\npolicy_file = \"/nonexistent.toml\"\n",
            &[],
            "mcp.policy_file",
        ),
    ];
    for (toml, env, key) in cases {
        let config = TempFile::new(toml);
        for sub in ["check-config", "serve"] {
            let out = run(&[sub, "--config", config.0.to_str().unwrap()], env);
            let stderr = String::from_utf8(out.stderr).unwrap();
            assert_eq!(
                out.status.code(),
                Some(64),
                "{sub} {toml} {env:?}: {stderr}"
            );
            assert!(stderr.contains(key), "{sub}: {stderr} lacks {key}");
            assert!(out.stdout.is_empty());
        }
    }
    let out = run(
        &["check-config", "--config", "/nonexistent/config.toml"],
        &[],
    );
    assert_eq!(out.status.code(), Some(64));
}

/// `GET path` on the admin listener; returns the status code.
fn admin_status(addr: &str, path: &str) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split(' ').nth(1).unwrap().parse().unwrap()
}

/// `serve --config config`: the child, its stderr lines after the `started` line, and
/// that line.
fn serve(config: &TempFile) -> (Child, mpsc::Receiver<String>, serde_json::Value) {
    let mut child = command(&["serve", "--config", config.0.to_str().unwrap()], &[])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let started = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("a `started` log line");
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if json["message"] == "started" {
            break json;
        }
    };
    (child, rx, started)
}

/// `runtime.threads = 1` runs everything on the main thread (the single-threaded event
/// loop); more gives that many workers beside it.
#[cfg(target_os = "linux")]
#[test]
fn runtime_threads_sets_the_threads_that_serve() {
    for (threads, expected_tasks) in [(1, 1), (3, 4)] {
        let config = TempFile::new(&format!(
            "[listen]\naddress = \"127.0.0.1:0\"\n[admin]\naddress = \"127.0.0.1:0\"\n\
             [upstream]\ngateway_url = \"http://127.0.0.1:{}\"\n[runtime]\nthreads = {threads}\n",
            free_port()
        ));
        let (mut child, _rx, started) = serve(&config);
        assert_eq!(started["threads"], threads, "{started}");
        let listen = started["listen"].as_str().unwrap().to_owned();
        let admin = started["admin"].as_str().unwrap().to_owned();
        // Requests are served (502: no gateway), and no thread was added for them.
        assert_eq!(admin_status(&listen, "/x"), 502);
        assert_eq!(admin_status(&admin, "/live"), 200);
        let tasks = std::fs::read_dir(format!("/proc/{}/task", child.id()))
            .unwrap()
            .count();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(tasks, expected_tasks, "threads = {threads}");
    }
}

#[test]
fn serve_runs_until_sigterm_and_exits_0() {
    let config = TempFile::new(&format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n[admin]\naddress = \"127.0.0.1:0\"\n\
         [upstream]\ngateway_url = \"http://127.0.0.1:{}\"\n[shutdown]\ndrain_seconds = 2\n",
        free_port()
    ));
    let (mut child, rx, started) = serve(&config);
    let admin = started["admin"].as_str().unwrap().to_owned();
    let listen = started["listen"].as_str().unwrap().to_owned();
    // A passthrough (502: no gateway) and an intercepted request, both with private bits.
    assert_eq!(admin_status(&listen, "/private-path/x?user=alice"), 502);
    let intercepted = admin_status(&listen, "/api/v1/section-source?path=private-note.md");
    assert_ne!(intercepted, 502);
    assert_eq!(admin_status(&admin, "/live"), 200);
    // No gateway is listening: alive but not ready.
    assert_eq!(admin_status(&admin, "/ready"), 503);

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    // The reader ends at EOF, once the process has exited.
    let rest: Vec<String> = rx.iter().collect();
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
    let mut routes = Vec::new();
    for line in &rest {
        assert!(
            !line.contains("private") && !line.contains("alice"),
            "leaked: {line}"
        );
        let json: serde_json::Value = serde_json::from_str(line).expect("JSON log line");
        let Some(route) = json["route"].as_str() else {
            continue;
        };
        routes.push(route.to_owned());
        let allowed: &[&str] = if route == "passthrough" {
            &["route", "status_class", "elapsed_ms"]
        } else {
            &[
                "route",
                "surface",
                "outcome",
                "status_class",
                "upstream_status_class",
                "elapsed_ms",
                "sections",
                "truncated",
            ]
        };
        for key in json.as_object().unwrap().keys() {
            let meta = ["timestamp", "level", "target", "message"].contains(&key.as_str());
            assert!(meta || allowed.contains(&key.as_str()), "{key} in {line}");
        }
    }
    routes.sort();
    assert_eq!(routes, ["intercepted", "passthrough"]);
}
