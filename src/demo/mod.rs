//! `knowtation-sidecar demo`: the sidecar in front of loopback mock upstreams (a
//! gateway, a canister holding the demo notes, and a bridge), with a freshly signed
//! token and ready-to-paste `curl` commands. Runs until Ctrl-C.
//!
//! The notes (`src/demo/vault/`) are compiled into the binary, so the demo runs from any
//! directory, from an installed binary and from the image.
//!
//! `demo --upstreams-only --dir DIR` runs the mock upstreams alone, for a trial of `serve`:
//! it writes a ready configuration pointing at them into `DIR/config.toml`, the secrets it
//! names into `DIR/jwt_secrets` and `DIR/gateway_secret` (mode 0600), and prints the
//! `serve` command and a token.

use std::collections::hash_map::RandomState;
use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, IsTerminal as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use crate::config::{Config, LogFormat, Secret};
use crate::proxy;
use knowtation_mock_upstream::{
    session_claims, try_sign_token, FrontmatterError, MockBridge, MockCanister, MockGateway,
};

/// Where the demo's sidecar listens.
pub const LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8080));

/// Where the demo's admin endpoints listen.
pub const ADMIN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9901));

/// The vault the demo notes live in (the header default, wire contract §1).
pub const VAULT_ID: &str = "default";

/// The note the printed `curl` asks about.
pub const DEMO_NOTE: &str = "projects/sidecar-rollout.md";

/// The `sub` of the demo token.
pub const DEMO_USER: &str = "demo-user";

/// Lifetime of the demo token.
pub const TOKEN_TTL: Duration = Duration::from_secs(3600);

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A fixed demo port is taken.
    #[error(
        "{addr} is already in use; stop whatever listens there (a demo still running?) and try again"
    )]
    PortBusy {
        /// The port.
        addr: SocketAddr,
    },
    /// A fixed demo port could not be checked.
    #[error("cannot listen on {addr}: {source}")]
    Port {
        /// The port.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A mock upstream could not bind a loopback port.
    #[error("cannot start a mock upstream: {0}")]
    Mock(#[source] io::Error),
    /// A demo note could not be loaded.
    #[error("cannot load the demo note {path}: {source}")]
    Note {
        /// The note.
        path: &'static str,
        /// Why.
        #[source]
        source: FrontmatterError,
    },
    /// The example notes lack the note the `curl` asks about.
    #[error("the demo notes lack {DEMO_NOTE}")]
    MissingNote,
    /// The sidecar did not start.
    #[error("cannot start the sidecar: {0}")]
    Start(String),
    /// The demo token could not be signed.
    #[error("cannot sign the demo token: {0}")]
    Token(#[from] jsonwebtoken::errors::Error),
    /// Ctrl-C could not be awaited.
    #[error("cannot wait for Ctrl-C: {0}")]
    Signal(#[source] io::Error),
    /// The sidecar stopped with an error.
    #[error("the sidecar stopped with an error: {0}")]
    Stop(String),
    /// The trial's directory or a file in it could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file or directory.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Base URLs of the mock upstreams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrls {
    /// The passthrough target.
    pub gateway: String,
    /// The note store.
    pub canister: String,
    /// The hosted-context service.
    pub bridge: String,
}

/// The demo notes, vault-relative path and raw Markdown, compiled in (a test keeps this
/// list equal to the files of `src/demo/vault/`).
pub const NOTES: &[(&str, &str)] = &[
    (
        "inbox/reading list.md",
        include_str!("vault/inbox/reading list.md"),
    ),
    (
        "journal/2025-02-14.md",
        include_str!("vault/journal/2025-02-14.md"),
    ),
    (
        "meetings/2025-03-04-weekly-sync.md",
        include_str!("vault/meetings/2025-03-04-weekly-sync.md"),
    ),
    (
        "projects/sidecar-rollout.md",
        include_str!("vault/projects/sidecar-rollout.md"),
    ),
    (
        "research/section-ids.md",
        include_str!("vault/research/section-ids.md"),
    ),
];

/// Where the demo listens: the sidecar and its admin endpoints.
#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    /// The sidecar.
    pub listen: SocketAddr,
    /// The admin endpoints.
    pub admin: SocketAddr,
}

impl Default for Addresses {
    fn default() -> Self {
        Addresses {
            listen: LISTEN,
            admin: ADMIN,
        }
    }
}

/// A fresh 256-bit hex secret. `RandomState` keys come from the OS random source (once
/// per thread, then stepped per instance), which gives a per-run secret without another
/// dependency; good for a demo, not meant for production keys.
pub fn random_secret() -> String {
    let mut out = String::with_capacity(64);
    for i in 0u64..4 {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(i);
        let _ = write!(out, "{:016x}", h.finish());
    }
    out
}

/// The demo's configuration: the given ports, the mocks as upstreams, one JWT secret,
/// `exp` required, the canister guarded by a gateway secret, plain logs, and no grace
/// and a short drain so Ctrl-C exits promptly.
pub fn build_config(
    at: Addresses,
    urls: &UpstreamUrls,
    jwt_secret: &str,
    gateway_secret: &str,
) -> Config {
    let mut config = Config::default();
    config.listen.address = at.listen;
    config.admin.address = at.admin;
    config.upstream.gateway_url = urls.gateway.clone();
    config.upstream.canister_url = Some(urls.canister.clone());
    config.upstream.bridge_url = Some(urls.bridge.clone());
    config.upstream.gateway_secret = Some(Secret::new(gateway_secret));
    config.auth.jwt_secrets = vec![Secret::new(jwt_secret)];
    config.auth.require_exp = true;
    config.shutdown.grace_seconds = 0;
    config.shutdown.drain_seconds = 2;
    config.log.format = LogFormat::Plain;
    config
}

/// What the banner shows.
#[derive(Debug, Clone)]
pub struct Banner<'a> {
    /// The sidecar's address.
    pub listen: SocketAddr,
    /// The admin address.
    pub admin: SocketAddr,
    /// The mocks.
    pub urls: &'a UpstreamUrls,
    /// How many notes the canister holds.
    pub notes: usize,
    /// The note the `curl` asks about.
    pub note: &'a str,
    /// A signed caller token.
    pub token: &'a str,
}

/// The text printed once everything runs.
pub fn render_banner(b: &Banner<'_>) -> String {
    let section_url = format!(
        "http://{}/api/v1/section-source?path={}",
        b.listen,
        encode_query_value(b.note)
    );
    let mut s = String::new();
    let _ = writeln!(s, "knowtation-sidecar demo\n");
    let _ = writeln!(s, "  sidecar   http://{}", b.listen);
    let _ = writeln!(s, "  admin     http://{}", b.admin);
    let _ = writeln!(
        s,
        "  gateway   {}  (mock: echoes every request passed through)",
        b.urls.gateway
    );
    let _ = writeln!(
        s,
        "  canister  {}  (mock: {} demo notes, vault \"{VAULT_ID}\")",
        b.urls.canister, b.notes
    );
    let _ = writeln!(s, "  bridge    {}  (mock hosted context)", b.urls.bridge);
    let _ = writeln!(
        s,
        "\nSection metadata of one note, served by the sidecar itself (token valid for 1 hour):\n"
    );
    let _ = writeln!(s, "  curl -sS '{section_url}' \\");
    let _ = writeln!(s, "    -H 'Authorization: Bearer {}' \\", b.token);
    let _ = writeln!(s, "    -H 'X-Vault-Id: {VAULT_ID}'");
    let _ = writeln!(
        s,
        "\nEverything else passes through to the gateway (the mock echoes what it received):\n"
    );
    let _ = writeln!(
        s,
        "  curl -sS 'http://{}/api/v1/echo?from=demo' -H 'X-Vault-Id: {VAULT_ID}'",
        b.listen
    );
    let mcp = format!("http://{}/mcp", b.listen);
    let mcp_headers = format!(
        "-H 'Authorization: Bearer {}' -H 'X-Vault-Id: {VAULT_ID}' \\\n    \
         -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream'",
        b.token
    );
    let _ = writeln!(
        s,
        "\nThe same over MCP: point any streamable-HTTP MCP client (e.g. the MCP Inspector,\n\
         `npx @modelcontextprotocol/inspector`) at {mcp} with the two headers above;\n\
         tools/list shows the gateway's tools plus get_section_source, get_note_outline and\n\
         get_document_tree, answered by the sidecar. Or by hand: initialize, then call a\n\
         tool with the session id it returns:\n"
    );
    let _ = writeln!(s, "  curl -sS -D - '{mcp}' {mcp_headers} \\");
    let _ = writeln!(
        s,
        "    -d '{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{{}},\"clientInfo\":{{\"name\":\"curl\",\"version\":\"0\"}}}}}}'"
    );
    let _ = writeln!(s, "  curl -sS '{mcp}' {mcp_headers} \\");
    let _ = writeln!(
        s,
        "    -H 'Mcp-Session-Id: <the mcp-session-id header above>' \\"
    );
    let _ = writeln!(
        s,
        "    -d '{{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{{\"name\":\"get_section_source\",\"arguments\":{{\"path\":\"{}\"}}}}}}'",
        b.note
    );
    let _ = writeln!(s, "\nAdmin:\n");
    for endpoint in ["live", "ready", "metrics"] {
        let _ = writeln!(s, "  curl -sS http://{}/{endpoint}", b.admin);
    }
    if b.listen.ip().is_loopback() {
        let _ = writeln!(
            s,
            "\nThe sidecar listens on loopback only. In a container, listen on every \
             interface and\npublish the ports:\n\n  \
             docker run --rm -p 8080:8080 -p 9901:9901 knowtation-sidecar \\\n    \
             demo --listen 0.0.0.0:8080 --admin 0.0.0.0:9901"
        );
    }
    let _ = writeln!(
        s,
        "\nTo try `serve` itself, with a configuration of your own, against these mocks:\n\
         `knowtation-sidecar demo --upstreams-only --dir DIR` (docs/operations.md)."
    );
    let _ = writeln!(s, "\nPress Ctrl-C to stop.");
    s
}

/// The tools the demo gateway lists over MCP; the sidecar adds the three view tools.
fn demo_gateway_tools() -> Vec<serde_json::Value> {
    let tool = |name: &str, description: &str| {
        serde_json::json!({
            "name": name,
            "description": description,
            "inputSchema": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        })
    };
    vec![
        tool("search", "Search notes (demo gateway stub)."),
        tool("get_note", "One note (demo gateway stub)."),
    ]
}

/// Percent-encodes a query value, keeping unreserved characters and `/` readable.
fn encode_query_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Fails early, with a message naming the port, when a fixed demo port is taken.
fn check_port(addr: SocketAddr) -> Result<(), DemoError> {
    match std::net::TcpListener::bind(addr) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(DemoError::PortBusy { addr }),
        Err(source) => Err(DemoError::Port { addr, source }),
    }
}

/// Human-readable logs on stderr, unless something already installed a subscriber;
/// colours only when stderr is a terminal (escape codes in a file or a pipe are noise).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Another subscriber already installed is fine: its output is used instead.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .try_init();
}

/// Runs the demo until Ctrl-C: starts the mocks, the sidecar in front of them, prints
/// the banner, then shuts down cleanly.
pub async fn run(at: Addresses) -> Result<(), Box<dyn std::error::Error>> {
    Ok(run_demo(at).await?)
}

/// Loads the compiled-in notes into `canister`; returns how many.
pub fn load_notes(canister: &MockCanister) -> Result<usize, DemoError> {
    canister.create_vault(VAULT_ID);
    for (path, raw) in NOTES {
        canister
            .insert_markdown(VAULT_ID, path, raw)
            .map_err(|source| DemoError::Note { path, source })?;
    }
    Ok(NOTES.len())
}

async fn run_demo(at: Addresses) -> Result<(), DemoError> {
    check_port(at.listen)?;
    check_port(at.admin)?;

    let gateway = MockGateway::try_start().await.map_err(DemoError::Mock)?;
    gateway.set_mcp_tools(Some(demo_gateway_tools()));
    let canister = MockCanister::try_start().await.map_err(DemoError::Mock)?;
    let bridge = MockBridge::try_start().await.map_err(DemoError::Mock)?;
    let notes = load_notes(&canister)?;
    if canister.stored_json(VAULT_ID, DEMO_NOTE).is_none() {
        return Err(DemoError::MissingNote);
    }
    let gateway_secret = random_secret();
    canister.set_gateway_secret(Some(&gateway_secret));

    let urls = UpstreamUrls {
        gateway: gateway.url(),
        canister: canister.url(),
        bridge: bridge.url(),
    };
    let jwt_secret = random_secret();
    let config = build_config(at, &urls, &jwt_secret, &gateway_secret);
    let token = try_sign_token(&jwt_secret, &session_claims(DEMO_USER, TOKEN_TTL))?;

    init_logging();
    let running = proxy::start(config)
        .await
        .map_err(|e| DemoError::Start(e.to_string()))?;

    let banner = render_banner(&Banner {
        listen: running.listen_addr,
        admin: running.admin_addr,
        urls: &urls,
        notes,
        note: DEMO_NOTE,
        token: &token,
    });
    let mut out = io::stdout().lock();
    // A closed stdout must not keep the sidecar from running or stopping.
    let _ = out.write_all(banner.as_bytes()).and_then(|()| out.flush());
    drop(out);

    let signal = tokio::signal::ctrl_c().await;
    eprintln!("\nstopping the sidecar...");
    running.shutdown();
    running
        .wait()
        .await
        .map_err(|e| DemoError::Stop(e.to_string()))?;
    // The mocks outlive the drain, so in-flight requests still reach them.
    drop((gateway, canister, bridge));
    signal.map_err(DemoError::Signal)
}

/// The files `demo --upstreams-only` writes: the configuration and the two secret files
/// it names.
#[derive(Debug, Clone)]
pub struct TrialFiles {
    /// `config.toml`.
    pub config: std::path::PathBuf,
    /// `jwt_secrets`, mode 0600.
    pub jwt_secrets: std::path::PathBuf,
    /// `gateway_secret`, mode 0600.
    pub gateway_secret: std::path::PathBuf,
}

impl TrialFiles {
    /// The three files in `dir`.
    pub fn in_dir(dir: &std::path::Path) -> TrialFiles {
        TrialFiles {
            config: dir.join("config.toml"),
            jwt_secrets: dir.join("jwt_secrets"),
            gateway_secret: dir.join("gateway_secret"),
        }
    }
}

/// A TOML basic string: JSON's string escapes are a subset of TOML's.
fn toml_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// The configuration `serve` needs to stand in front of the mocks at `urls`, on the
/// addresses `at`, reading its secrets from `files`: what a working deployment sets
/// (`docs/configuration.md`), and no secret inline.
pub fn trial_config(at: Addresses, urls: &UpstreamUrls, files: &TrialFiles) -> String {
    let path = |p: &std::path::Path| toml_string(&p.to_string_lossy());
    format!(
        "# Written by `knowtation-sidecar demo --upstreams-only`: a trial of `serve` in front\n\
         # of the demo's mock gateway, canister and bridge. It works while that demo runs (the\n\
         # mocks and the secrets are new on each run). Every key: docs/configuration.md.\n\
         \n\
         [listen]\n\
         address = {listen}\n\
         \n\
         [admin]\n\
         address = {admin}\n\
         \n\
         [upstream]\n\
         gateway_url = {gateway}\n\
         canister_url = {canister}\n\
         bridge_url = {bridge}\n\
         gateway_secret_file = {gateway_secret}\n\
         \n\
         [auth]\n\
         jwt_secrets_file = {jwt_secrets}\n\
         \n\
         [shutdown]\n\
         # Stop at once on Ctrl-C: nothing balances traffic away from a trial.\n\
         grace_seconds = 0\n\
         \n\
         [log]\n\
         format = \"plain\"\n",
        listen = toml_string(&at.listen.to_string()),
        admin = toml_string(&at.admin.to_string()),
        gateway = toml_string(&urls.gateway),
        canister = toml_string(&urls.canister),
        bridge = toml_string(&urls.bridge),
        gateway_secret = path(&files.gateway_secret),
        jwt_secrets = path(&files.jwt_secrets),
    )
}

/// Writes `contents` to `path`, readable by its owner only (created so, never widened
/// after: a secret is not readable by others for an instant).
fn write_private(path: &std::path::Path, contents: &str) -> Result<(), DemoError> {
    let fail = |source| DemoError::Write {
        path: path.to_path_buf(),
        source,
    };
    // Replaced whole: an older file may have another mode.
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(fail(e)),
        _ => {}
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(fail)?;
    file.write_all(contents.as_bytes()).map_err(fail)
}

/// What the banner of `--upstreams-only` shows.
#[derive(Debug, Clone)]
pub struct TrialBanner<'a> {
    /// Where `serve` will listen.
    pub at: Addresses,
    /// The mocks.
    pub urls: &'a UpstreamUrls,
    /// How many notes the canister holds.
    pub notes: usize,
    /// The files written.
    pub files: &'a TrialFiles,
    /// A signed caller token.
    pub token: &'a str,
}

/// The text `--upstreams-only` prints once the mocks run.
pub fn render_trial_banner(b: &TrialBanner<'_>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "knowtation-sidecar demo --upstreams-only\n");
    let _ = writeln!(
        s,
        "  gateway   {}  (mock: echoes every request passed through; MCP tools search, get_note_outline)",
        b.urls.gateway
    );
    let _ = writeln!(
        s,
        "  canister  {}  (mock: {} demo notes, vault \"{VAULT_ID}\"; requires the gateway secret)",
        b.urls.canister, b.notes
    );
    let _ = writeln!(s, "  bridge    {}  (mock hosted context)", b.urls.bridge);
    let _ = writeln!(s, "\nWritten for `serve`:\n");
    let _ = writeln!(s, "  {}  (the configuration)", b.files.config.display());
    let _ = writeln!(
        s,
        "  {}  (the JWT secret, mode 0600)",
        b.files.jwt_secrets.display()
    );
    let _ = writeln!(
        s,
        "  {}  (the gateway secret, mode 0600)",
        b.files.gateway_secret.display()
    );
    let config = b.files.config.display();
    let _ = writeln!(s, "\nIn another terminal, check it, then run it:\n");
    let _ = writeln!(s, "  knowtation-sidecar check-config --config {config}");
    let _ = writeln!(s, "  knowtation-sidecar serve --config {config}");
    let _ = writeln!(
        s,
        "\nThen, with this token (signed with the secret in {}, valid for 1 hour):\n",
        b.files.jwt_secrets.display()
    );
    let _ = writeln!(s, "  TOKEN={}", b.token);
    let _ = writeln!(
        s,
        "\n  curl -sS 'http://{}/api/v1/section-source?path={}' \\",
        b.at.listen,
        encode_query_value(DEMO_NOTE)
    );
    let _ = writeln!(
        s,
        "    -H \"Authorization: Bearer $TOKEN\" -H 'X-Vault-Id: {VAULT_ID}'"
    );
    let _ = writeln!(
        s,
        "\n  MCP: point a streamable-HTTP client at http://{}/mcp with the header\n  \
         Authorization: Bearer $TOKEN and call get_section_source with {{\"path\": \"{DEMO_NOTE}\"}}.",
        b.at.listen
    );
    let _ = writeln!(
        s,
        "\n  Admin: curl -sS http://{}/ready   curl -sS http://{}/metrics",
        b.at.admin, b.at.admin
    );
    let _ = writeln!(
        s,
        "\nThe mocks and these secrets live until Ctrl-C here. docs/operations.md, \"A first\n\
         trial of serve\", walks through it."
    );
    let _ = writeln!(s, "\nPress Ctrl-C to stop.");
    s
}

/// Runs the mock upstreams alone until Ctrl-C, having written `serve`'s configuration
/// and secrets into `dir` (created mode 0700 if missing).
pub async fn run_upstreams_only(
    at: Addresses,
    dir: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    Ok(upstreams_only(at, dir).await?)
}

async fn upstreams_only(at: Addresses, dir: &std::path::Path) -> Result<(), DemoError> {
    let fail = |source| DemoError::Write {
        path: dir.to_path_buf(),
        source,
    };
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir).map_err(fail)?;
    // Absolute, so the configuration works from any directory.
    let dir = dir.canonicalize().map_err(fail)?;
    let files = TrialFiles::in_dir(&dir);

    let gateway = MockGateway::try_start().await.map_err(DemoError::Mock)?;
    gateway.set_mcp_tools(Some(demo_gateway_tools()));
    let canister = MockCanister::try_start().await.map_err(DemoError::Mock)?;
    let bridge = MockBridge::try_start().await.map_err(DemoError::Mock)?;
    let notes = load_notes(&canister)?;
    let gateway_secret = random_secret();
    canister.set_gateway_secret(Some(&gateway_secret));
    let urls = UpstreamUrls {
        gateway: gateway.url(),
        canister: canister.url(),
        bridge: bridge.url(),
    };
    let jwt_secret = random_secret();
    write_private(&files.jwt_secrets, &format!("{jwt_secret}\n"))?;
    write_private(&files.gateway_secret, &format!("{gateway_secret}\n"))?;
    let config = trial_config(at, &urls, &files);
    std::fs::write(&files.config, config).map_err(|source| DemoError::Write {
        path: files.config.clone(),
        source,
    })?;
    let token = try_sign_token(&jwt_secret, &session_claims(DEMO_USER, TOKEN_TTL))?;

    init_logging();
    let banner = render_trial_banner(&TrialBanner {
        at,
        urls: &urls,
        notes,
        files: &files,
        token: &token,
    });
    let mut out = io::stdout().lock();
    let _ = out.write_all(banner.as_bytes()).and_then(|()| out.flush());
    drop(out);
    let signal = tokio::signal::ctrl_c().await;
    eprintln!("\nstopping the mock upstreams...");
    drop((gateway, canister, bridge));
    signal.map_err(DemoError::Signal)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    fn urls() -> UpstreamUrls {
        UpstreamUrls {
            gateway: "http://127.0.0.1:1001".into(),
            canister: "http://127.0.0.1:1002".into(),
            bridge: "http://127.0.0.1:1003".into(),
        }
    }

    #[test]
    fn config_points_at_the_mocks() {
        let jwt = "demo-jwt-secret-0123456789abcdef";
        let c = build_config(Addresses::default(), &urls(), jwt, "gw-secret");
        assert_eq!(c.listen.address.to_string(), "127.0.0.1:8080");
        assert_eq!(c.admin.address.to_string(), "127.0.0.1:9901");
        assert_eq!(c.upstream.gateway_url, "http://127.0.0.1:1001");
        assert_eq!(
            c.upstream.canister_url.as_deref(),
            Some("http://127.0.0.1:1002")
        );
        assert_eq!(
            c.upstream.bridge_url.as_deref(),
            Some("http://127.0.0.1:1003")
        );
        assert_eq!(
            c.upstream.gateway_secret.as_ref().map(Secret::expose),
            Some("gw-secret")
        );
        let secrets: Vec<&str> = c.auth.jwt_secrets.iter().map(Secret::expose).collect();
        assert_eq!(secrets, [jwt]);
        assert!(c.auth.require_exp);
        assert_eq!(crate::config::validate(&c), Ok(()));
        // Secrets never show in a dump of the config.
        let dump = format!("{c:?}");
        assert!(!dump.contains(jwt) && !dump.contains("gw-secret"));
    }

    #[test]
    fn the_trial_config_loads_names_its_secret_files_and_holds_no_secret() {
        let dir = std::env::temp_dir().join(format!("ks-trial-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = TrialFiles::in_dir(&dir);
        let (jwt, gw) = (random_secret(), random_secret());
        write_private(&files.jwt_secrets, &format!("{jwt}\n")).unwrap();
        write_private(&files.gateway_secret, &format!("{gw}\n")).unwrap();
        let text = trial_config(Addresses::default(), &urls(), &files);
        std::fs::write(&files.config, &text).unwrap();
        let c = crate::config::load_with_env(Some(&files.config), &[]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!text.contains(&jwt) && !text.contains(&gw), "{text}");
        assert_eq!(c.upstream.gateway_url, "http://127.0.0.1:1001");
        assert_eq!(
            c.upstream.gateway_secret.as_ref().map(Secret::expose),
            Some(gw.as_str())
        );
        let secrets: Vec<&str> = c.auth.jwt_secrets.iter().map(Secret::expose).collect();
        assert_eq!(secrets, [jwt.as_str()]);
        // Nothing left inert: the trial is a working deployment.
        assert_eq!(crate::config::warnings(&c), []);
        assert_eq!(c.listen.address, LISTEN);
        assert_eq!(c.admin.address, ADMIN);
    }

    #[test]
    fn secrets_are_fresh_256_bit_hex() {
        let (a, b) = (random_secret(), random_secret());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn demo_note_exists_in_the_example_vault() {
        assert!(NOTES.iter().any(|(p, _)| *p == DEMO_NOTE));
    }

    /// The compiled-in list is exactly the files of `src/demo/vault/`, byte for byte.
    #[test]
    fn compiled_notes_match_the_vault_folder() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/demo/vault");
        let mut on_disk = Vec::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    let rel = path
                        .strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned();
                    on_disk.push((rel, std::fs::read_to_string(&path).unwrap()));
                }
            }
        }
        on_disk.sort();
        let compiled: Vec<(String, String)> = NOTES
            .iter()
            .map(|(p, raw)| ((*p).to_owned(), (*raw).to_owned()))
            .collect();
        assert_eq!(on_disk, compiled);
    }

    /// Splits a shell command the way `sh` would for the subset the banner uses:
    /// single quotes, backslash-newline continuations, plain words.
    fn shell_words(cmd: &str) -> Vec<String> {
        let joined = cmd.replace("\\\n", " ");
        let mut words = Vec::new();
        let mut cur = String::new();
        let mut in_word = false;
        let mut chars = joined.chars();
        while let Some(c) = chars.next() {
            match c {
                '\'' => {
                    in_word = true;
                    for q in chars.by_ref() {
                        if q == '\'' {
                            break;
                        }
                        cur.push(q);
                    }
                }
                c if c.is_whitespace() => {
                    if in_word {
                        words.push(std::mem::take(&mut cur));
                        in_word = false;
                    }
                }
                c => {
                    assert!(!"\"$`\\;&|<>()*?[]".contains(c), "unquoted {c:?}");
                    in_word = true;
                    cur.push(c);
                }
            }
        }
        if in_word {
            words.push(cur);
        }
        words
    }

    /// The banner's command that starts with `curl -sS '<prefix>`, continuation lines
    /// included.
    fn command(banner: &str, prefix: &str) -> String {
        let start = banner
            .find(&format!("curl -sS '{prefix}"))
            .unwrap_or_else(|| panic!("no curl for {prefix} in:\n{banner}"));
        let mut cmd = String::new();
        for line in banner[start..].lines() {
            cmd.push_str(line.trim_start());
            if !line.ends_with('\\') {
                break;
            }
            cmd.push('\n');
        }
        cmd
    }

    #[test]
    fn banner_curl_is_ready_to_paste() {
        let secret = random_secret();
        let token = try_sign_token(&secret, &session_claims(DEMO_USER, TOKEN_TTL)).unwrap();
        let urls = urls();
        let banner = render_banner(&Banner {
            listen: LISTEN,
            admin: ADMIN,
            urls: &urls,
            notes: 5,
            note: "inbox/reading list.md",
            token: &token,
        });

        let words = shell_words(&command(&banner, "http://127.0.0.1:8080/api/v1/section"));
        assert_eq!(
            words,
            [
                "curl",
                "-sS",
                "http://127.0.0.1:8080/api/v1/section-source?path=inbox/reading%20list.md",
                "-H",
                &format!("Authorization: Bearer {token}"),
                "-H",
                "X-Vault-Id: default",
            ]
        );
        let uri: http::Uri = words[2].parse().unwrap();
        assert_eq!(uri.path(), "/api/v1/section-source");

        // The printed token verifies with the secret and lives one hour.
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.required_spec_claims = ["exp".to_owned()].into();
        let data = jsonwebtoken::decode::<serde_json::Value>(
            &token,
            &jsonwebtoken::DecodingKey::from_secret(secret.as_bytes()),
            &validation,
        )
        .unwrap();
        assert_eq!(data.claims["sub"], DEMO_USER);
        assert_eq!(data.claims["type"], "session");
        let ttl = data.claims["exp"].as_u64().unwrap() - data.claims["iat"].as_u64().unwrap();
        assert_eq!(ttl, 3600);

        let passthrough = shell_words(&command(&banner, "http://127.0.0.1:8080/api/v1/echo"));
        assert_eq!(
            passthrough,
            [
                "curl",
                "-sS",
                "http://127.0.0.1:8080/api/v1/echo?from=demo",
                "-H",
                "X-Vault-Id: default",
            ]
        );
        for endpoint in ["live", "ready", "metrics"] {
            assert!(banner.contains(&format!("curl -sS http://127.0.0.1:9901/{endpoint}\n")));
        }
        for url in [&urls.gateway, &urls.canister, &urls.bridge] {
            assert!(banner.contains(url.as_str()));
        }
        // On loopback, the banner says how to be reached from outside a container.
        assert!(
            banner.contains("demo --listen 0.0.0.0:8080 --admin 0.0.0.0:9901"),
            "{banner}"
        );
        let everywhere = render_banner(&Banner {
            listen: "0.0.0.0:8080".parse().unwrap(),
            admin: "0.0.0.0:9901".parse().unwrap(),
            urls: &urls,
            notes: 5,
            note: "inbox/reading list.md",
            token: &token,
        });
        assert!(!everywhere.contains("docker run"), "{everywhere}");
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode_query_value("a/b c.md"), "a/b%20c.md");
        assert_eq!(encode_query_value("é&x=1#"), "%C3%A9%26x%3D1%23");
    }
}
