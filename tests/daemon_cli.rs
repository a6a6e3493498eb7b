//! The built binary: `check-config` and `serve` with valid and invalid configurations.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use knowtation_testkit::{session_claims, sign_token};

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

/// 32 bytes or more: JWT secrets the loader accepts, each marked so a leak is visible.
const JWT_FILE: &str = "jwt-from-file-AAAA-0123456789abcdef";
const JWT_ENV: &str = "jwt-from-env-CCCC-0123456789abcdef";
const JWT_TOML: &str = "jwt-from-toml-EEEE-0123456789abcdef";

/// Lines of TOML that are not comments.
fn settings(toml: &str) -> impl Iterator<Item = &str> {
    toml.lines().filter(|l| !l.trim_start().starts_with('#'))
}

#[test]
fn check_config_prints_secrets_as_comments_naming_their_sources() {
    let secrets = TempFile::new(&format!("{JWT_FILE}\n"));
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
            ("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", JWT_ENV),
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
    // Each secret key is one comment saying where its values came from; the file keys
    // still name their files, and nothing looks set twice.
    assert!(
        stdout.contains("\n# gateway_secret = <redacted, from gateway_secret_file>\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "\n# jwt_secrets = <2 redacted: 1 from the environment \
             (KNOWTATION_SIDECAR_AUTH__JWT_SECRETS), then 1 from jwt_secrets_file>\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("\njwt_secrets_file = {:?}\n", secrets.0)),
        "{stdout}"
    );
    for line in settings(&stdout) {
        assert!(!line.contains("redacted"), "a loadable placeholder: {line}");
        assert!(!line.starts_with("jwt_secrets ="), "{line}");
        assert!(!line.starts_with("gateway_secret ="), "{line}");
    }
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

    // From the config file and the environment.
    let inline = TempFile::new(&format!(
        "[upstream]\ngateway_url = \"http://127.0.0.1:3000\"\n\
         [auth]\njwt_secrets = [\"{JWT_TOML}\"]\n"
    ));
    let out = run(
        &["check-config", "--config", inline.0.to_str().unwrap()],
        &[("KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_SECRET", "gw-env-DDDD")],
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    assert!(
        !stdout.contains("EEEE") && !stdout.contains("DDDD"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "\n# gateway_secret = <redacted, from the environment \
             (KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_SECRET)>\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("\n# jwt_secrets = <1 redacted: 1 from the config file>\n"),
        "{stdout}"
    );

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

/// What `check-config` prints, saved and used as the configuration, holds no secret of
/// its own: a token signed with the placeholder is refused, while the secret file it
/// still names keeps working.
#[test]
fn check_config_output_used_as_a_config_accepts_no_placeholder() {
    let secrets = TempFile::new(&format!("{JWT_FILE}\n"));
    let original = TempFile::new(&format!(
        "[listen]\naddress = \"127.0.0.1:0\"\n[admin]\naddress = \"127.0.0.1:0\"\n\
         [upstream]\ngateway_url = \"http://127.0.0.1:{}\"\ngateway_secret = \"gw-inline-FFFF\"\n\
         [auth]\njwt_secrets_file = {:?}\nallow_extra_secrets = true\n",
        free_port(),
        secrets.0
    ));
    let out = run(
        &["check-config", "--config", original.0.to_str().unwrap()],
        &[("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", JWT_ENV)],
    );
    assert!(out.status.success());
    let saved = TempFile::new(std::str::from_utf8(&out.stdout).unwrap());

    let (mut child, _rx, started) = serve(&saved);
    let listen = started["listen"].as_str().unwrap().to_owned();
    let status = |secret: &str| {
        let token = sign_token(secret, session_claims("cli-user", Duration::from_secs(600)));
        http_status(
            &listen,
            "/api/v1/section-source?path=a.md",
            Some(&format!("Bearer {token}")),
        )
    };
    let forged = status("<redacted>");
    let from_env = status(JWT_ENV);
    let from_file = status(JWT_FILE);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(forged, 401, "a token signed with the placeholder");
    assert_eq!(
        from_env, 401,
        "the environment's secret is not in the output"
    );
    assert_ne!(from_file, 401, "the secret file is still read");

    let again = run(
        &["check-config", "--config", saved.0.to_str().unwrap()],
        &[],
    );
    let printed = String::from_utf8(again.stdout).unwrap();
    assert!(again.status.success(), "{:?}", again.stderr);
    assert!(
        printed.contains("\n# jwt_secrets = <1 redacted: 1 from jwt_secrets_file>\n"),
        "{printed}"
    );
    assert!(
        printed.contains("\n# gateway_secret = unset\n"),
        "{printed}"
    );
}

/// (description, config file after `[upstream]`, environment, the key the error names)
type SecretCase = (
    &'static str,
    String,
    Vec<(&'static str, String)>,
    &'static str,
);

/// `value` as each secret, from the config file, the environment and the `*_file`
/// (written to `file`).
fn secret_cases(value: &str, file: &TempFile) -> Vec<SecretCase> {
    std::fs::write(&file.0, format!("{value}\n")).unwrap();
    let quoted = serde_json::Value::from(value).to_string();
    let path = format!("{:?}", file.0);
    vec![
        (
            "jwt file",
            format!("[auth]\njwt_secrets_file = {path}\n"),
            vec![],
            "auth.jwt_secrets_file",
        ),
        (
            "jwt toml",
            format!("[auth]\njwt_secrets = [{quoted}]\n"),
            vec![],
            "auth.jwt_secrets",
        ),
        (
            "jwt env",
            String::new(),
            vec![("KNOWTATION_SIDECAR_AUTH__JWT_SECRETS", value.to_owned())],
            "auth.jwt_secrets",
        ),
        (
            "gateway file",
            format!("[upstream]\ngateway_secret_file = {path}\n"),
            vec![],
            "upstream.gateway_secret_file",
        ),
        (
            "gateway toml",
            format!("[upstream]\ngateway_secret = {quoted}\n"),
            vec![],
            "upstream.gateway_secret",
        ),
        (
            "gateway env",
            String::new(),
            vec![(
                "KNOWTATION_SIDECAR_UPSTREAM__GATEWAY_SECRET",
                value.to_owned(),
            )],
            "upstream.gateway_secret",
        ),
    ]
}

/// `sub --config` for one case: (exit code, stdout, stderr).
fn run_case(sub: &str, (_, toml, env, _): &SecretCase) -> (Option<i32>, String, String) {
    // `[upstream]` may open the case's own text: the gateway URL goes after it.
    let text = if let Some(rest) = toml.strip_prefix("[upstream]\n") {
        format!("[upstream]\ngateway_url = \"http://127.0.0.1:3000\"\n{rest}")
    } else {
        format!("[upstream]\ngateway_url = \"http://127.0.0.1:3000\"\n{toml}")
    };
    let config = TempFile::new(&text);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // A `serve` that accepts the config runs on: it is stopped, its code then `None`.
    let mut child = command(&[sub, "--config", config.0.to_str().unwrap()], &env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let t0 = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, stdout.join().unwrap(), stderr.join().unwrap())
}

#[test]
fn the_redacted_placeholder_is_refused_from_every_source() {
    let file = TempFile::new("");
    for value in [
        "<redacted>",
        "GGGG-0123456789abcdef-0123456789-<redacted>-HHHH",
    ] {
        for case in secret_cases(value, &file) {
            for sub in ["check-config", "serve"] {
                let (code, stdout, stderr) = run_case(sub, &case);
                let (what, key) = (case.0, case.3);
                assert_eq!(code, Some(64), "{sub} {what} {value}: {stderr}");
                assert!(stdout.is_empty(), "{sub} {what}: {stdout}");
                assert!(
                    stderr.contains(&format!("{key}: ")) && stderr.contains("placeholder"),
                    "{sub} {what}: {stderr}"
                );
                assert!(
                    !stderr.contains("GGGG") && !stderr.contains("HHHH"),
                    "{sub} {what}: {stderr}"
                );
            }
        }
    }
}

#[test]
fn jwt_secrets_under_32_bytes_are_refused_from_every_source() {
    let file = TempFile::new("");
    let short = "IIII-0123456789abcdef-012345678"; // 31 bytes
    assert_eq!(short.len(), 31);
    for case in secret_cases(short, &file) {
        let what = case.0;
        if what.starts_with("gateway") {
            // The canister compares an opaque header value: no floor.
            let (code, _, stderr) = run_case("check-config", &case);
            assert_eq!(code, Some(0), "{what}: {stderr}");
            continue;
        }
        for sub in ["check-config", "serve"] {
            let (code, _, stderr) = run_case(sub, &case);
            assert_eq!(code, Some(64), "{sub} {what}: {stderr}");
            assert!(
                stderr.contains(&format!("{}: ", case.3))
                    && stderr.contains("shorter than 32 bytes"),
                "{sub} {what}: {stderr}"
            );
            assert!(!stderr.contains("IIII"), "{sub} {what}: {stderr}");
        }
    }
    let enough = "JJJJ-0123456789abcdef-0123456789"; // 32 bytes
    assert_eq!(enough.len(), 32);
    for case in secret_cases(enough, &file) {
        let (code, stdout, stderr) = run_case("check-config", &case);
        assert_eq!(code, Some(0), "{}: {stderr}", case.0);
        assert!(!stdout.contains("JJJJ"), "{stdout}");
    }
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
    http_status(addr, path, None)
}

/// `GET path` with an optional `Authorization` value; returns the status code.
fn http_status(addr: &str, path: &str, authorization: Option<&str>) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
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

/// `runtime.threads` is the number of workers that serve, each a thread with its own
/// event loop, beside the control thread (signals, admin, the gateway probe); serving
/// adds no thread.
#[cfg(target_os = "linux")]
#[test]
fn runtime_threads_sets_the_threads_that_serve() {
    for (threads, expected_tasks) in [(1, 2), (3, 4)] {
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
            &["route", "request_id", "status_class", "elapsed_ms"]
        } else {
            &[
                "route",
                "request_id",
                "surface",
                "view",
                "outcome",
                "status_class",
                "upstream_status_class",
                "elapsed_ms",
                "sections",
                "truncated",
                // A 401's reason: a closed word, never the token.
                "auth_reason",
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

/// `extract --view`: each view of a raw file, a stored note and a manifest is the
/// library's document of that note, byte for byte; the default is SectionSource.
#[test]
fn extract_prints_the_view_asked_for() {
    use knowtation_sidecar::extract::{self, Limits, View};
    let raw =
        "---\ntitle: Views\nsecret: CANARY-FM\n---\n# A\nbody CANARY-BODY\n### B\n## C\n# D\n";
    let file = TempFile::new(raw);
    let stored = TempFile::new(&serde_json::json!({"path": "x", "frontmatter": {"title": "Views"}, "body": "# A\nbody CANARY-BODY\n### B\n## C\n# D\n"}).to_string());
    let dir = std::env::temp_dir().join(format!("ks-cli-manifest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("one.md"), raw).unwrap();
    std::fs::write(
        dir.join("m.tsv"),
        "id\tpath\tfile\n1\tnotes/one.md\tone.md\n2\t../x.md\tone.md\n",
    )
    .unwrap();
    let manifest = dir.join("m.tsv");

    let p = knowtation_sidecar::path::validate("notes/one.md").unwrap();
    let want = |view: View| {
        extract::parse_from_raw(&p, raw, &Limits::default())
            .unwrap()
            .view_charged(view, &mut |_| true)
            .unwrap()
            .to_json()
    };
    let file_arg = file.0.to_str().unwrap();
    let stored_arg = stored.0.to_str().unwrap();
    let manifest_arg = manifest.to_str().unwrap();
    for view in View::ALL {
        let name = view.as_str();
        let out = run(
            &[
                "extract",
                "--view",
                name,
                "--path",
                "notes/one.md",
                file_arg,
            ],
            &[],
        );
        assert!(out.status.success(), "{name}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(text, format!("{}\n", want(view)), "{name}: raw file");
        assert!(!text.contains("CANARY"), "{name}");

        let out = run(
            &[
                "extract",
                "--view",
                name,
                "--path",
                "notes/one.md",
                "--stored",
                stored_arg,
            ],
            &[],
        );
        assert!(out.status.success(), "{name}: {out:?}");
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("{}\n", want(view)),
            "{name}: stored"
        );

        let out = run(
            &["extract", "--view", name, "--manifest", manifest_arg],
            &[],
        );
        assert!(out.status.success(), "{name}: {out:?}");
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!(
                "{{\"id\":\"1\",\"ok\":true,\"result\":{}}}\n{{\"id\":\"2\",\"ok\":false,\"error\":\"invalid_path\"}}\n",
                want(view)
            ),
            "{name}: manifest"
        );
    }
    let out = run(&["extract", "--path", "notes/one.md", file_arg], &[]);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{}\n", want(View::SectionSource)),
        "the default view"
    );
    let out = run(
        &[
            "extract",
            "--view",
            "body",
            "--path",
            "notes/one.md",
            file_arg,
        ],
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown view is a usage error"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
