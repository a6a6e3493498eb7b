//! A mock of the bridge's hosted-context service (wire contract §2).

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Method, Response, StatusCode};

use super::body::MockBody;
use super::server::{json, lock, respond, status_from, Recorded, Server};

const ROUTE: &str = "/api/v1/hosted-context";

/// A canned answer: status, raw body bytes, optional content type, delay.
#[derive(Debug, Clone)]
pub struct Reply {
    status: u16,
    body: Bytes,
    content_type: Option<String>,
    delay: Duration,
}

impl Reply {
    /// A JSON answer.
    pub fn json(status: u16, value: &serde_json::Value) -> Reply {
        Reply {
            status,
            body: Bytes::from(value.to_string()),
            content_type: Some("application/json".to_owned()),
            delay: Duration::ZERO,
        }
    }

    /// Exactly these bytes (for malformed answers), labelled `application/json`.
    pub fn raw(status: u16, body: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            body: body.into(),
            content_type: Some("application/json".to_owned()),
            delay: Duration::ZERO,
        }
    }

    /// Waits this long before the response head.
    pub fn with_delay(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }

    /// Uses another `Content-Type`, or none.
    pub fn with_content_type(mut self, content_type: Option<&str>) -> Reply {
        self.content_type = content_type.map(str::to_owned);
        self
    }

    fn response(&self) -> Response<MockBody> {
        let status = status_from(self.status);
        match &self.content_type {
            Some(ct) => respond(
                status,
                &[(CONTENT_TYPE.as_str(), ct)],
                MockBody::full(self.body.clone()),
            ),
            None => respond(status, &[], MockBody::full(self.body.clone())),
        }
    }
}

#[derive(Debug)]
struct State {
    default: Reply,
    per_vault: HashMap<String, Reply>,
}

/// A mock bridge: `GET /api/v1/hosted-context` answers the reply configured for the
/// request's trimmed `X-Vault-Id` if there is one, else the default reply. Other methods
/// get 405, other paths 404. The `Authorization` and `X-Vault-Id` it got are in
/// [`MockBridge::requests`].
///
/// The default reply is 200
/// `{"allowed_vault_ids":["default"],"scope":null,"role":"editor"}` (no effective user):
/// the caller acts as itself (`sub`) in the `default` vault.
#[derive(Debug)]
pub struct MockBridge {
    server: Server,
    state: Arc<Mutex<State>>,
}

impl MockBridge {
    /// The default hosted context, see [`MockBridge`].
    pub fn default_context() -> serde_json::Value {
        serde_json::json!({
            "allowed_vault_ids": ["default"],
            "scope": null,
            "role": "editor",
        })
    }

    /// Starts a bridge on `127.0.0.1:0` with the default reply.
    ///
    /// # Panics
    /// If no loopback port can be bound; use [`MockBridge::try_start`] to handle that.
    pub async fn start() -> MockBridge {
        match MockBridge::try_start().await {
            Ok(b) => b,
            Err(e) => panic!("mock bridge: cannot bind 127.0.0.1:0: {e}"),
        }
    }

    /// Starts a bridge on `127.0.0.1:0` with the default reply.
    pub async fn try_start() -> io::Result<MockBridge> {
        let state = Arc::new(Mutex::new(State {
            default: Reply::json(200, &MockBridge::default_context()),
            per_vault: HashMap::new(),
        }));
        let shared = Arc::clone(&state);
        let server = Server::start(Arc::new(move |rec| {
            let state = Arc::clone(&shared);
            Box::pin(async move { handle(&state, rec).await })
        }))
        .await?;
        Ok(MockBridge { server, state })
    }

    /// Replaces the default reply.
    pub fn set_reply(&self, reply: Reply) {
        lock(&self.state).default = reply;
    }

    /// Sets the reply for one vault id.
    pub fn set_reply_for_vault(&self, vault: &str, reply: Reply) {
        lock(&self.state).per_vault.insert(vault.to_owned(), reply);
    }

    /// Sets the default reply's JSON body (keeps its status and delay).
    pub fn set_json(&self, value: &serde_json::Value) {
        let mut state = lock(&self.state);
        state.default.body = Bytes::from(value.to_string());
        state.default.content_type = Some("application/json".to_owned());
    }

    /// Sets the default reply's status (keeps its body and delay).
    pub fn set_status(&self, status: u16) {
        lock(&self.state).default.status = status;
    }

    /// Sets the default reply's delay.
    pub fn set_delay(&self, delay: Duration) {
        lock(&self.state).default.delay = delay;
    }

    /// The `Authorization` header of each lookup, in order (`None` when absent).
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.requests()
            .iter()
            .map(|r| r.header("authorization").map(str::to_owned))
            .collect()
    }

    /// The `X-Vault-Id` header of each lookup, in order (`None` when absent).
    pub fn vault_ids(&self) -> Vec<Option<String>> {
        self.requests()
            .iter()
            .map(|r| r.header("x-vault-id").map(str::to_owned))
            .collect()
    }
}

async fn handle(state: &Mutex<State>, rec: Recorded) -> Response<MockBody> {
    if rec.path() != ROUTE {
        return json(
            StatusCode::NOT_FOUND,
            r#"{"error":"Not found","code":"NOT_FOUND"}"#,
        );
    }
    if rec.method != Method::GET {
        return json(
            StatusCode::METHOD_NOT_ALLOWED,
            r#"{"error":"Method not allowed","code":"METHOD_NOT_ALLOWED"}"#,
        );
    }
    let reply = {
        let state = lock(state);
        rec.header("x-vault-id")
            .and_then(|v| state.per_vault.get(v.trim()))
            .unwrap_or(&state.default)
            .clone()
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    reply.response()
}

journal_accessors!(MockBridge);
