//! What an operator meets first, through the built binary: its version line, the shell
//! completions and man pages generated from the command line, the demo's output when it
//! goes to a pipe, and a first trial of `serve` as `docs/operations.md` walks through it:
//! `demo --upstreams-only`, `check-config`, `serve`, then a real MCP client.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_knowtation-sidecar");

/// The binary with an empty environment, so nothing inherited (`NO_COLOR`, a
/// `KNOWTATION_SIDECAR_*` variable) changes what it does.
fn command(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args).env_clear();
    c
}

fn run(args: &[&str]) -> Output {
    command(args).output().expect("the binary runs")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// A fresh directory under the temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ks-operator-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The output of a command, when it ran and succeeded.
fn output_of(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[test]
fn version_names_the_commit_and_the_compiler() {
    let line = stdout(&run(&["--version"]));
    let prefix = format!("knowtation-sidecar {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(line.starts_with(&prefix), "{line}");
    // Built from this checkout with nothing passed in: the commit git names.
    if std::env::var_os("KNOWTATION_SIDECAR_COMMIT").is_none() {
        if let Some(commit) = output_of("git", &["rev-parse", "--short=12", "HEAD"]) {
            assert!(line.contains(&format!("(commit {commit}, ")), "{line}");
        }
    }
    if let Some(rustc) = output_of("rustc", &["--version"]) {
        let version = rustc.split_whitespace().nth(1).unwrap();
        assert!(
            line.trim_end().ends_with(&format!(", rustc {version})")),
            "{line}"
        );
    }
}

/// Every subcommand, and the long options of each, as the command line defines them.
fn subcommands() -> Vec<(String, Vec<String>)> {
    knowtation_sidecar::cli::command()
        .get_subcommands()
        .map(|sub| {
            let longs = sub
                .get_arguments()
                .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
                .collect();
            (sub.get_name().to_owned(), longs)
        })
        .collect()
}

#[test]
fn completions_cover_every_subcommand_and_option() {
    let subs = subcommands();
    assert!(subs.len() >= 6, "{subs:?}");
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout(&run(&["completions", shell]));
        for (name, longs) in &subs {
            assert!(script.contains(name.as_str()), "{shell}: no {name}");
            for long in longs {
                // fish names a long option `-l NAME`, the others `--NAME`.
                let fish = format!("-l {}", &long[2..]);
                assert!(
                    script.contains(long.as_str()) || script.contains(&fish),
                    "{shell}: no {long} of {name}"
                );
            }
        }
    }
    // The bash script parses, and registers a completion for the binary.
    let dir = TempDir::new("completions");
    let file = dir.0.join("knowtation-sidecar.bash");
    std::fs::write(&file, stdout(&run(&["completions", "bash"]))).unwrap();
    if let Some(registered) = output_of(
        "bash",
        &[
            "-c",
            &format!("source {:?} && complete -p knowtation-sidecar", file),
        ],
    ) {
        assert!(registered.contains("knowtation-sidecar"), "{registered}");
    }
    let unknown = run(&["completions", "tcsh"]);
    assert_eq!(unknown.status.code(), Some(2), "a usage error");
}

#[test]
fn man_pages_describe_every_subcommand_and_option() {
    let page = stdout(&run(&["manpage"]));
    assert!(page.contains(".TH knowtation-sidecar 1"), "{page}");
    let dir = TempDir::new("man");
    stdout(&run(&["manpage", "--dir", dir.0.to_str().unwrap()]));
    assert!(dir.0.join("knowtation-sidecar.1").is_file());
    for (name, longs) in subcommands() {
        let file = dir.0.join(format!("knowtation-sidecar-{name}.1"));
        let page =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(page.contains(".TH knowtation-sidecar-"), "{name}");
        for long in longs {
            // roff writes every `-` as `\-`.
            let roff = long.replace('-', "\\-");
            assert!(page.contains(&roff), "{name}: no {long}");
        }
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A child whose stdout and stderr lines are collected as they come, apart.
struct Collected {
    child: Child,
    out: Arc<Mutex<Vec<String>>>,
    err: Arc<Mutex<Vec<String>>>,
}

impl Collected {
    fn spawn(args: &[&str]) -> Collected {
        let mut child = command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let collect = |stream: Box<dyn Read + Send>| {
            let lines = Arc::new(Mutex::new(Vec::new()));
            let sink = Arc::clone(&lines);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    sink.lock().unwrap().push(line);
                }
            });
            lines
        };
        let out = collect(Box::new(child.stdout.take().unwrap()));
        let err = collect(Box::new(child.stderr.take().unwrap()));
        Collected { child, out, err }
    }

    /// Waits for a stdout line containing `needle`.
    fn wait_stdout(&self, needle: &str) {
        let t0 = Instant::now();
        while !self.out.lock().unwrap().iter().any(|l| l.contains(needle)) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no {needle:?} in:\n{}\nstderr:\n{}",
                self.out.lock().unwrap().join("\n"),
                self.err.lock().unwrap().join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn interrupt_and_wait(&mut self) {
        let sent = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let t0 = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(t0.elapsed() < Duration::from_secs(20), "did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Collected {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_demo_writes_no_colour_codes_to_a_pipe_and_says_how_to_listen_in_a_container() {
    let (listen, admin) = (free_addr(), free_addr());
    let mut demo = Collected::spawn(&[
        "demo",
        "--listen",
        &listen.to_string(),
        "--admin",
        &admin.to_string(),
    ]);
    demo.wait_stdout("Press Ctrl-C to stop.");
    demo.interrupt_and_wait();
    // The reader threads see the end of both pipes once the process is gone.
    let t0 = Instant::now();
    while !demo
        .err
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("stopped"))
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "no `stopped` line");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = demo.out.lock().unwrap().join("\n");
    let err = demo.err.lock().unwrap().join("\n");
    assert!(err.contains("proxy listening"), "{err}");
    assert!(!err.contains('\u{1b}'), "colour codes on stderr:\n{err}");
    assert!(!out.contains('\u{1b}'), "colour codes on stdout:\n{out}");
    assert!(
        out.contains("demo --listen 0.0.0.0:8080 --admin 0.0.0.0:9901"),
        "{out}"
    );
}

/// The value of the `TOKEN=` line of a banner.
fn printed_token(lines: &[String]) -> String {
    lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("TOKEN="))
        .expect("a TOKEN= line")
        .to_owned()
}

/// `docs/operations.md`, "A first trial of serve", step by step: the mock upstreams alone
/// write a configuration and its secrets, `check-config` accepts it with no warning,
/// `serve` runs it, and the printed token gets the note's sections over REST and from a
/// real MCP client (rmcp) calling `get_section_source`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_trial_of_serve_answers_a_real_mcp_client() {
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;

    let dir = TempDir::new("trial");
    let trial = dir.0.join("trial");
    let (listen, admin) = (free_addr(), free_addr());
    let upstreams = Collected::spawn(&[
        "demo",
        "--upstreams-only",
        "--dir",
        trial.to_str().unwrap(),
        "--listen",
        &listen.to_string(),
        "--admin",
        &admin.to_string(),
    ]);
    upstreams.wait_stdout("Press Ctrl-C to stop.");
    let banner = upstreams.out.lock().unwrap().clone();
    let token = printed_token(&banner);
    let config = trial.join("config.toml");
    let text = banner.join("\n");
    assert!(
        text.contains(&format!(
            "knowtation-sidecar serve --config {}",
            config.display()
        )),
        "{text}"
    );

    // The secrets are in files only their owner reads, and nowhere else.
    for name in ["jwt_secrets", "gateway_secret"] {
        let path = trial.join(name);
        let secret = std::fs::read_to_string(&path).unwrap();
        assert_eq!(secret.trim().len(), 64, "{name}");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
        assert!(!text.contains(secret.trim()), "{name} printed");
        let toml = std::fs::read_to_string(&config).unwrap();
        assert!(!toml.contains(secret.trim()), "{name} inline in the config");
    }

    // check-config: valid, nothing left inert.
    let checked = run(&["check-config", "--config", config.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&checked.stderr).into_owned();
    assert!(checked.status.success(), "{stderr}");
    assert!(!stderr.contains("warning:"), "{stderr}");

    // serve, from another directory: the configuration names absolute paths.
    let serve = Collected::spawn(&["serve", "--config", config.to_str().unwrap()]);
    let ready = format!("http://{admin}/ready");
    let t0 = Instant::now();
    while knowtation_testkit::client::get(&ready, &[])
        .await
        .map_or(true, |r| r.status != 200)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "serve never became ready:\n{}",
            serve.err.lock().unwrap().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let bearer = format!("Bearer {token}");
    let rest = knowtation_testkit::client::get(
        &format!("http://{listen}/api/v1/section-source?path=projects/sidecar-rollout.md"),
        &[("Authorization", &bearer), ("X-Vault-Id", "default")],
    )
    .await
    .unwrap();
    assert_eq!(rest.status, 200, "{}", rest.text());
    assert_eq!(rest.json()["schema"], "knowtation.section_source/v0");
    assert!(!rest.text().contains("DEMO-SECRET-BODY-TEXT"));

    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("http://{listen}/mcp"))
            .auth_header(token.clone()),
    );
    let client = ().serve(transport).await.expect("initialize through serve");
    let tools = client.list_all_tools().await.unwrap();
    assert!(
        tools.iter().any(|t| t.name == "get_section_source"),
        "{tools:?}"
    );
    let args = serde_json::json!({"path": "projects/sidecar-rollout.md"})
        .as_object()
        .unwrap()
        .clone();
    let result = client
        .call_tool(CallToolRequestParams::new("get_section_source").with_arguments(args))
        .await
        .unwrap();
    assert_ne!(result.is_error, Some(true));
    let content = serde_json::to_value(&result.content).unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(content[0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(doc["schema"], "knowtation.section_source/v0");
    assert_eq!(doc["path"], "projects/sidecar-rollout.md");
    let _ = client.cancel().await;
}
