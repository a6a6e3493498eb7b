//! A mock of the canister, the note store (wire contract §4).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Response, StatusCode};
use serde::Serialize;

use super::body::MockBody;
use super::frontmatter::{split_markdown, FrontmatterError};
use super::server::{json, lock, percent_decode, respond, status_from, Recorded, Server};

/// Most Markdown files [`MockCanister::load_vault`] reads from one folder tree.
pub const MAX_VAULT_FILES: usize = 10_000;

/// Raw files larger than this are refused by [`MockCanister::load_vault`].
const MAX_VAULT_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// Deepest folder nesting [`MockCanister::load_vault`] descends into.
const MAX_VAULT_DEPTH: usize = 64;

const NOTES_PREFIX: &str = "/api/v1/notes/";
const NOT_FOUND: &str = r#"{"error":"Not found","code":"NOT_FOUND"}"#;
const FORBIDDEN: &str = r#"{"error":"Forbidden","code":"FORBIDDEN"}"#;

/// Why a vault folder could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    /// A file or folder could not be read.
    #[error("{}: {source}", file.display())]
    Io {
        /// The file or folder.
        file: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A note is not UTF-8, or its name is not.
    #[error("{}: not UTF-8", file.display())]
    NotUtf8 {
        /// The file.
        file: PathBuf,
    },
    /// A note is over the size cap.
    #[error("{}: file is too large", file.display())]
    TooLarge {
        /// The file.
        file: PathBuf,
    },
    /// More than [`MAX_VAULT_FILES`] notes, or folders nested too deep.
    #[error("{}: vault is too large or too deep", dir.display())]
    TooMany {
        /// The folder being read.
        dir: PathBuf,
    },
    /// Frontmatter outside the supported subset.
    #[error("{}: {source}", file.display())]
    Frontmatter {
        /// The file.
        file: PathBuf,
        /// The offending line.
        #[source]
        source: FrontmatterError,
    },
}

/// A forced answer for one note path (any vault); built with the methods below.
///
/// The status replaces the normal one and the body replaces the normal one (the note
/// JSON when the note exists, else the 404 body), so `status(500)` alone answers 500
/// with the note's JSON: a test can check that an upstream body is never forwarded.
#[derive(Debug, Clone, Default)]
pub struct CanisterOverride {
    status: Option<u16>,
    body: Option<Bytes>,
    delay: Option<Duration>,
    stall_body: Option<Duration>,
}

impl CanisterOverride {
    /// An override that changes nothing yet.
    pub fn new() -> CanisterOverride {
        CanisterOverride::default()
    }

    /// Answer with this status.
    pub fn status(mut self, code: u16) -> CanisterOverride {
        self.status = Some(code);
        self
    }

    /// Answer with exactly these body bytes (still `Content-Type: application/json`).
    pub fn body(mut self, bytes: impl Into<Bytes>) -> CanisterOverride {
        self.body = Some(bytes.into());
        self
    }

    /// Wait this long before sending the response head (replaces the global delay).
    pub fn delay(mut self, delay: Duration) -> CanisterOverride {
        self.delay = Some(delay);
        self
    }

    /// Send the head and the first half of the body, then wait this long before the
    /// rest: a total timeout must cover the body too (wire contract §4).
    pub fn stall_body(mut self, stall: Duration) -> CanisterOverride {
        self.stall_body = Some(stall);
        self
    }
}

/// The stored note as the canister answers it; field order as the canister writes it.
#[derive(Serialize)]
struct StoredNote<'a> {
    path: &'a str,
    frontmatter: &'a str,
    body: &'a str,
}

#[derive(Debug, Default)]
struct State {
    /// vault id → note path → the exact 200 body.
    vaults: HashMap<String, BTreeMap<String, Bytes>>,
    gateway_secret: Option<String>,
    overrides: HashMap<String, CanisterOverride>,
    delay: Duration,
}

/// A mock canister: `GET /api/v1/notes/{encodeURIComponent(path)}` in the vault named by
/// `X-Vault-Id` (trimmed; `default` when absent).
///
/// Answers, in order: 403 `{"error":"Forbidden","code":"FORBIDDEN"}` when a gateway
/// secret is configured and `X-Gateway-Auth` differs; `GET /health` → 200; 404
/// `{"error":"Not found","code":"NOT_FOUND"}` for any other route; 405 for a method other
/// than GET on a note; 400 for a malformed escape; then a per-path override if one is
/// set; then 200 with the note or 404 for an unknown note or vault. The note key is the
/// whole percent-decoded remainder, so a literal `/` is accepted too: tests check the
/// exact encoding through [`MockCanister::requests`]. Notes are shared by every user:
/// `X-User-Id` is recorded, not used.
#[derive(Debug)]
pub struct MockCanister {
    server: Server,
    state: Arc<Mutex<State>>,
}

impl MockCanister {
    /// Starts an empty canister on `127.0.0.1:0`.
    ///
    /// # Panics
    /// If no loopback port can be bound; use [`MockCanister::try_start`] to handle that.
    pub async fn start() -> MockCanister {
        match MockCanister::try_start().await {
            Ok(c) => c,
            Err(e) => panic!("mock canister: cannot bind 127.0.0.1:0: {e}"),
        }
    }

    /// Starts an empty canister on `127.0.0.1:0`.
    pub async fn try_start() -> io::Result<MockCanister> {
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let server = Server::start(Arc::new(move |rec| {
            let state = Arc::clone(&shared);
            Box::pin(async move { handle(&state, rec).await })
        }))
        .await?;
        Ok(MockCanister { server, state })
    }

    /// Stores a note; `frontmatter` is stored as its compact JSON text, as the canister
    /// does (keys in serde_json's sorted order; only `title` and `project` are ever read).
    pub fn insert_note(
        &self,
        vault: &str,
        path: &str,
        frontmatter: &serde_json::Value,
        body: &str,
    ) {
        self.insert_note_fm_text(vault, path, &frontmatter.to_string(), body);
    }

    /// Stores a note with an arbitrary `frontmatter` string (for malformed-frontmatter
    /// cases).
    pub fn insert_note_fm_text(&self, vault: &str, path: &str, frontmatter: &str, body: &str) {
        let note = StoredNote {
            path,
            frontmatter,
            body,
        };
        // Serializing three strings cannot fail; an empty body would show up in tests.
        let json = serde_json::to_vec(&note).unwrap_or_default();
        lock(&self.state)
            .vaults
            .entry(vault.to_owned())
            .or_default()
            .insert(path.to_owned(), Bytes::from(json));
    }

    /// Stores a raw Markdown note, splitting its frontmatter (see [`super::split_markdown`]
    /// for the supported subset).
    pub fn insert_markdown(
        &self,
        vault: &str,
        path: &str,
        raw: &str,
    ) -> Result<(), FrontmatterError> {
        let (frontmatter, body) = split_markdown(raw)?;
        self.insert_note(vault, path, &serde_json::Value::Object(frontmatter), body);
        Ok(())
    }

    /// Creates an empty vault (so notes in it are 404, not the vault).
    pub fn create_vault(&self, vault: &str) {
        lock(&self.state)
            .vaults
            .entry(vault.to_owned())
            .or_default();
    }

    /// Removes a note; returns whether it existed.
    pub fn remove_note(&self, vault: &str, path: &str) -> bool {
        lock(&self.state)
            .vaults
            .get_mut(vault)
            .is_some_and(|notes| notes.remove(path).is_some())
    }

    /// Loads every `*.md` file under `dir` (recursively, skipping names that start with
    /// `.` and symbolic links) into `vault`, keyed by its `/`-separated path relative to
    /// `dir`. Frontmatter is read with [`super::split_markdown`]'s small YAML subset.
    /// Returns how many notes were loaded.
    pub fn load_vault(&self, vault: &str, dir: &Path) -> Result<usize, VaultError> {
        let mut found = Vec::new();
        collect_markdown(dir, dir, 0, &mut found)?;
        let mut notes = Vec::with_capacity(found.len());
        for (file, rel) in found {
            let raw = read_note(&file)?;
            let (frontmatter, body) =
                split_markdown(&raw).map_err(|source| VaultError::Frontmatter {
                    file: file.clone(),
                    source,
                })?;
            notes.push((rel, serde_json::Value::Object(frontmatter), body.to_owned()));
        }
        self.create_vault(vault);
        for (rel, frontmatter, body) in &notes {
            self.insert_note(vault, rel, frontmatter, body);
        }
        Ok(notes.len())
    }

    /// The paths stored in a vault, sorted.
    pub fn note_paths(&self, vault: &str) -> Vec<String> {
        lock(&self.state)
            .vaults
            .get(vault)
            .map(|notes| notes.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The exact 200 body the canister serves for a note.
    pub fn stored_json(&self, vault: &str, path: &str) -> Option<Bytes> {
        lock(&self.state)
            .vaults
            .get(vault)
            .and_then(|notes| notes.get(path).cloned())
    }

    /// Requires `X-Gateway-Auth` to equal `secret` (`None`: no check).
    pub fn set_gateway_secret(&self, secret: Option<&str>) {
        lock(&self.state).gateway_secret = secret.map(str::to_owned);
    }

    /// Forces the answer for one note path (decoded, any vault).
    pub fn set_override(&self, path: &str, o: CanisterOverride) {
        lock(&self.state).overrides.insert(path.to_owned(), o);
    }

    /// Removes a forced answer.
    pub fn clear_override(&self, path: &str) {
        lock(&self.state).overrides.remove(path);
    }

    /// Waits this long before every answer without an override delay.
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.state).delay = delay;
    }
}

fn collect_markdown(
    root: &Path,
    dir: &Path,
    depth: usize,
    out: &mut Vec<(PathBuf, String)>,
) -> Result<(), VaultError> {
    let io_err = |file: &Path| {
        let file = file.to_path_buf();
        move |source| VaultError::Io { file, source }
    };
    if depth > MAX_VAULT_DEPTH {
        return Err(VaultError::TooMany {
            dir: dir.to_path_buf(),
        });
    }
    let mut entries = std::fs::read_dir(dir)
        .map_err(io_err(dir))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_err(dir))?;
    // Sorted, so loading is deterministic.
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            return Err(VaultError::NotUtf8 { file: path });
        };
        if name.starts_with('.') {
            continue;
        }
        let kind = entry.file_type().map_err(io_err(&path))?;
        if kind.is_dir() {
            collect_markdown(root, &path, depth + 1, out)?;
        } else if kind.is_file() && name.ends_with(".md") {
            if out.len() >= MAX_VAULT_FILES {
                return Err(VaultError::TooMany {
                    dir: root.to_path_buf(),
                });
            }
            let rel = vault_relative(root, &path)?;
            out.push((path, rel));
        }
    }
    Ok(())
}

/// `a/b/c.md` for `<root>/a/b/c.md`, whatever the platform separator.
fn vault_relative(root: &Path, file: &Path) -> Result<String, VaultError> {
    let rel = file.strip_prefix(root).map_err(|_| VaultError::NotUtf8 {
        file: file.to_path_buf(),
    })?;
    rel.components()
        .map(|c| {
            c.as_os_str().to_str().ok_or_else(|| VaultError::NotUtf8 {
                file: file.to_path_buf(),
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(|parts| parts.join("/"))
}

fn read_note(file: &Path) -> Result<String, VaultError> {
    use std::io::Read;
    let io_err = |source| VaultError::Io {
        file: file.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .map_err(io_err)?
        .take(MAX_VAULT_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_err)?;
    if bytes.len() as u64 > MAX_VAULT_FILE_BYTES {
        return Err(VaultError::TooLarge {
            file: file.to_path_buf(),
        });
    }
    String::from_utf8(bytes).map_err(|_| VaultError::NotUtf8 {
        file: file.to_path_buf(),
    })
}

/// What to send, decided under the lock; the waiting happens after it is released.
struct Plan {
    status: StatusCode,
    body: Bytes,
    delay: Duration,
    stall_body: Option<Duration>,
    allow_get: bool,
}

impl Plan {
    fn json(status: StatusCode, body: &'static str, delay: Duration) -> Plan {
        Plan {
            status,
            body: Bytes::from_static(body.as_bytes()),
            delay,
            stall_body: None,
            allow_get: false,
        }
    }
}

fn decide(state: &State, rec: &Recorded) -> Plan {
    let delay = state.delay;
    if let Some(secret) = &state.gateway_secret {
        if rec.header("x-gateway-auth") != Some(secret.as_str()) {
            return Plan::json(StatusCode::FORBIDDEN, FORBIDDEN, delay);
        }
    }
    let path = rec.path();
    if path == "/health" && rec.method == Method::GET {
        return Plan::json(StatusCode::OK, r#"{"ok":true}"#, delay);
    }
    let Some(encoded) = path.strip_prefix(NOTES_PREFIX).filter(|e| !e.is_empty()) else {
        return Plan::json(StatusCode::NOT_FOUND, NOT_FOUND, delay);
    };
    if rec.method != Method::GET {
        let mut plan = Plan::json(
            StatusCode::METHOD_NOT_ALLOWED,
            r#"{"error":"Method not allowed","code":"METHOD_NOT_ALLOWED"}"#,
            delay,
        );
        plan.allow_get = true;
        return plan;
    }
    let Some(note_path) = percent_decode(encoded) else {
        return Plan::json(
            StatusCode::BAD_REQUEST,
            r#"{"error":"Bad request","code":"BAD_REQUEST"}"#,
            delay,
        );
    };
    let vault = rec.header("x-vault-id").map_or("default", str::trim);
    let stored = state
        .vaults
        .get(vault)
        .and_then(|notes| notes.get(&note_path));
    let (status, body) = match stored {
        Some(json) => (StatusCode::OK, json.clone()),
        None => (
            StatusCode::NOT_FOUND,
            Bytes::from_static(NOT_FOUND.as_bytes()),
        ),
    };
    match state.overrides.get(&note_path) {
        None => Plan {
            status,
            body,
            delay,
            stall_body: None,
            allow_get: false,
        },
        Some(o) => Plan {
            status: o.status.map_or(status, status_from),
            body: o.body.clone().unwrap_or(body),
            delay: o.delay.unwrap_or(delay),
            stall_body: o.stall_body,
            allow_get: false,
        },
    }
}

async fn handle(state: &Mutex<State>, rec: Recorded) -> Response<MockBody> {
    let plan = decide(&lock(state), &rec);
    if !plan.delay.is_zero() {
        tokio::time::sleep(plan.delay).await;
    }
    let Some(stall) = plan.stall_body else {
        let mut resp = json(plan.status, plan.body);
        if plan.allow_get {
            resp.headers_mut()
                .insert(ALLOW, http::HeaderValue::from_static("GET"));
        }
        return resp;
    };
    let len = plan.body.len();
    let (tx, body) = MockBody::channel(Some(len as u64));
    let first = plan.body.slice(..len / 2);
    let rest = plan.body.slice(len / 2..);
    tokio::spawn(async move {
        // A closed channel means the client left; nothing more to send.
        if !first.is_empty() && tx.send(first).await.is_err() {
            return;
        }
        tokio::time::sleep(stall).await;
        let _ = tx.send(rest).await;
    });
    let len = len.to_string();
    respond(
        plan.status,
        &[
            (CONTENT_TYPE.as_str(), "application/json"),
            (CONTENT_LENGTH.as_str(), len.as_str()),
        ],
        body,
    )
}

journal_accessors!(MockCanister);
