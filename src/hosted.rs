//! The hosted-context lookup (wire contract §2): one bridge call per `sub` + vault,
//! successful answers cached for both surfaces.
//!
//! The client only reports what happened; each surface applies its own policy (REST:
//! `hosted_context.on_failure`; MCP: no session without a successful lookup).
//!
//! Decisions where the contract is silent:
//! - The bridge gets exactly `Authorization` (the caller's, verbatim), `Accept` and
//!   `X-Vault-Id` (the trimmed value, or `default` when the caller sent none).
//! - An answer must be a JSON object within [`MAX_BRIDGE_BODY_BYTES`]; a `scope` that is
//!   neither null nor an object makes it malformed (a failed lookup). Inside `scope`, a
//!   `projects` or `folders` that is present, not null and not an array turns the scope
//!   filter on with nothing allowed, and non-string folder entries are ignored: a scope
//!   the sidecar cannot read narrows access instead of widening it.
//! - The cache also has a byte budget ([`MAX_CACHE_BYTES`]) besides
//!   `hosted_context.cache_max_entries`, because a cached key (the `sub`) and answer can
//!   each be large; the oldest entries go first when either bound is reached.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tracing::Instrument as _;

use http::{HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use serde_json::Value;

use crate::config::{self, ConfigError};
use crate::extract::FmValue;
use crate::js;
use crate::ratelimit::{self, RateLimit};
use crate::upstream::{self, Caller, ConnId, Connector, Observer};

/// Largest bridge answer read; more is a failed lookup.
pub const MAX_BRIDGE_BODY_BYTES: usize = 64 * 1024;

/// Byte budget of the cache (keys plus answer sizes).
pub const MAX_CACHE_BYTES: usize = 32 * 1024 * 1024;

/// The gateway clamps the lookup timeout to this range (§2).
const TIMEOUT_RANGE_MS: (u64, u64) = (250, 10_000);

/// What the bridge said about one caller and vault (§2).
#[derive(Clone, PartialEq)]
pub struct HostedAccess {
    /// `effective_canister_user_id` when it is a string (possibly empty or blank).
    pub effective_canister_user_id: Option<String>,
    /// The string entries of `allowed_vault_ids` when it is an array.
    pub allowed_vault_ids: Option<Vec<String>>,
    /// `scope`, when an object.
    pub scope: Option<Scope>,
    /// `role`, when a string.
    pub role: Option<String>,
}

impl fmt::Debug for HostedAccess {
    // User ids, vault names and scope entries are never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostedAccess")
            .field(
                "allowed_vault_ids",
                &self.allowed_vault_ids.as_ref().map(Vec::len),
            )
            .field(
                "scope_active",
                &self.scope.as_ref().is_some_and(Scope::is_active),
            )
            .finish_non_exhaustive()
    }
}

impl HostedAccess {
    /// REST's effective user (§2): `effective_canister_user_id` when a non-empty string
    /// (not trimmed), else `sub`.
    pub fn rest_effective_user<'a>(&'a self, sub: &'a str) -> &'a str {
        match self.effective_canister_user_id.as_deref() {
            Some(id) if !id.is_empty() => id,
            _ => sub,
        }
    }

    /// MCP's effective user (§2): `effective_canister_user_id` JavaScript-trimmed when
    /// not blank, else `sub`.
    pub fn mcp_effective_user<'a>(&'a self, sub: &'a str) -> &'a str {
        match self.effective_canister_user_id.as_deref().map(js::trim) {
            Some(id) if !id.is_empty() => id,
            _ => sub,
        }
    }

    /// MCP's role (§2): `role` when a non-empty string, else `viewer`.
    pub fn mcp_role(&self) -> &str {
        match self.role.as_deref() {
            Some(r) if !r.is_empty() => r,
            _ => "viewer",
        }
    }

    /// REST's vault check (§2): refused only when `allowed_vault_ids` is an array that
    /// lacks `vault`.
    pub fn vault_allowed(&self, vault: &str) -> bool {
        self.allowed_vault_ids
            .as_ref()
            .is_none_or(|ids| ids.iter().any(|v| v == vault))
    }

    /// Parses a bridge answer; `None` when it is not a usable context (§2): not an
    /// object, `allowed_vault_ids` missing or not an array of strings, an
    /// `effective_canister_user_id` that is present but not a string, or a `scope` that
    /// is neither null nor an object. The real bridge always sends both ids on success,
    /// and its errors come with a non-2xx status; a 2xx error body fails closed.
    pub fn from_json(bytes: &[u8]) -> Option<HostedAccess> {
        let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(bytes) else {
            return None;
        };
        let ids = o.get("allowed_vault_ids")?.as_array()?;
        let allowed_vault_ids = ids
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<String>>>()?;
        let effective_canister_user_id = match o.get("effective_canister_user_id") {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return None,
        };
        let scope = match o.get("scope") {
            None | Some(Value::Null) => None,
            Some(Value::Object(s)) => Some(Scope::from_json(s)),
            Some(_) => return None,
        };
        Some(HostedAccess {
            effective_canister_user_id,
            allowed_vault_ids: Some(allowed_vault_ids),
            scope,
            role: o.get("role").and_then(Value::as_str).map(str::to_owned),
        })
    }

    /// Rough size in memory, for the cache budget.
    fn weight(&self) -> usize {
        let strings = |v: &Option<Vec<String>>| {
            v.as_ref()
                .map_or(0, |v| v.iter().map(|s| s.len() + 24).sum::<usize>())
        };
        let scope = self.scope.as_ref().map_or(0, |s| {
            s.folders.iter().map(|f| f.len() + 24).sum::<usize>()
                + s.projects
                    .iter()
                    .map(|p| p.to_string().len() + 32)
                    .sum::<usize>()
        });
        128 + self
            .effective_canister_user_id
            .as_ref()
            .map_or(0, String::len)
            + strings(&self.allowed_vault_ids)
            + scope
            + self.role.as_ref().map_or(0, String::len)
    }
}

/// The caller's scope (§5 scope filter).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Scope {
    /// `scope.projects` entries that are strings, numbers or booleans (only those can be
    /// strictly equal to a frontmatter value).
    pub projects: Vec<Value>,
    /// `scope.folders` string entries, as given (not normalized).
    pub folders: Vec<String>,
    /// Whether `projects` or `folders` is non-empty (or unreadable), which turns the
    /// filter on.
    active: bool,
}

impl Scope {
    fn from_json(o: &serde_json::Map<String, Value>) -> Scope {
        let mut active = false;
        let mut list = |key: &str| -> Vec<Value> {
            match o.get(key) {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => {
                    active |= !a.is_empty();
                    a.clone()
                }
                Some(_) => {
                    active = true;
                    Vec::new()
                }
            }
        };
        let projects = list("projects")
            .into_iter()
            .filter(|v| matches!(v, Value::String(_) | Value::Number(_) | Value::Bool(_)))
            .collect();
        let folders = list("folders")
            .into_iter()
            .filter_map(|v| match v {
                Value::String(s) => Some(s),
                _ => None,
            })
            .collect();
        Scope {
            projects,
            folders,
            active,
        }
    }

    /// Builds an active scope from lists (tests and other surfaces).
    pub fn new(projects: Vec<Value>, folders: Vec<String>) -> Scope {
        let active = !projects.is_empty() || !folders.is_empty();
        Scope {
            projects,
            folders,
            active,
        }
    }

    /// Whether the filter applies (§5: a non-empty `scope.projects` or `scope.folders`).
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The §5 scope filter: `folder` (the normalized path minus its last segment) equals
    /// or is below a scope folder, or `project` (raw frontmatter value) is truthy and
    /// strictly equal to a scope project. Always true when the filter is off.
    pub fn allows(&self, folder: &str, project: Option<&FmValue>) -> bool {
        if !self.active {
            return true;
        }
        let in_folder = self.folders.iter().any(|f| {
            folder == f
                || folder
                    .strip_prefix(f.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        });
        in_folder
            || project.is_some_and(|p| self.projects.iter().any(|e| strictly_equal_truthy(p, e)))
    }
}

/// JavaScript `p && p === e` for a frontmatter value and a scope entry: only strings,
/// numbers and `true` can be both truthy and strictly equal to a JSON entry (objects and
/// arrays compare by identity).
fn strictly_equal_truthy(p: &FmValue, e: &Value) -> bool {
    match (p, e) {
        (FmValue::String(a), Value::String(b)) => !a.is_empty() && a == b,
        // NaN is falsy and never equal; 0 and -0 are falsy.
        (FmValue::Number(a), Value::Number(b)) => *a != 0.0 && b.as_f64() == Some(*a),
        (FmValue::Bool(true), Value::Bool(true)) => true,
        _ => false,
    }
}

/// Why a lookup failed. Never carries anything from the request or the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostedError {
    /// No answer within the timeout (body included).
    #[error("hosted-context lookup timed out")]
    Timeout,
    /// Connection or protocol failure.
    #[error("hosted-context lookup failed")]
    Transport,
    /// The bridge said 403.
    #[error("bridge refused access")]
    Forbidden,
    /// Another non-2xx status.
    #[error("bridge answered a non-success status")]
    Status(u16),
    /// The answer was over [`MAX_BRIDGE_BODY_BYTES`].
    #[error("bridge answer too large")]
    TooLarge,
    /// The answer was not a usable JSON object.
    #[error("bridge answer malformed")]
    Malformed,
    /// The caller's `Authorization` could not be forwarded, or the URL could not be built.
    #[error("hosted-context request could not be built")]
    Request,
    /// The caller's bridge-call budget
    /// (`hosted_context.max_lookups_per_user_per_minute`) is spent; no call was made.
    #[error("hosted-context lookups throttled")]
    Throttled(ratelimit::Limited),
}

/// Where a successful answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The cache.
    Cached,
    /// A bridge call made for this request.
    Fetched,
}

/// The bridge client and its cache; one per process, shared by both surfaces.
pub struct HostedClient {
    uri: Uri,
    /// Computed once rather than formatted by the client on every call.
    host: Option<HeaderValue>,
    client: upstream::Client,
    timeout: Duration,
    cache: Mutex<Cache>,
    /// Bridge calls per `sub`, whatever the vault.
    calls: RateLimit,
}

impl fmt::Debug for HostedClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostedClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HostedClient {
    /// A client for the configured bridge, its framing faults told to `observer`;
    /// `Ok(None)` when none is configured.
    pub fn new(
        config: &config::Config,
        connector: &Connector,
        observer: Observer,
    ) -> Result<Option<HostedClient>, ConfigError> {
        let Some(base) = config.upstream.bridge_url.as_deref() else {
            return Ok(None);
        };
        const KEY: &str = "upstream.bridge_url";
        let uri = endpoint(base, "/api/v1/hosted-context").ok_or_else(|| ConfigError {
            key: KEY.to_owned(),
            message: "must be an absolute http or https URL without query or fragment".to_owned(),
        })?;
        let hc = &config.hosted_context;
        let timeout = hc.timeout_ms.clamp(TIMEOUT_RANGE_MS.0, TIMEOUT_RANGE_MS.1);
        Ok(Some(HostedClient {
            host: upstream::http1_host(&uri),
            client: pooled_client(&uri, connector, config, observer, KEY)?,
            uri,
            timeout: Duration::from_millis(timeout),
            cache: Mutex::new(
                Cache::new(
                    Duration::from_secs(hc.cache_ttl_seconds),
                    hc.cache_max_entries,
                    MAX_CACHE_BYTES,
                )
                .with_failure_ttl(Duration::from_secs(hc.failure_cache_ttl_seconds)),
            ),
            calls: RateLimit::new(&config::RateLimit {
                per_user_per_minute: hc.max_lookups_per_user_per_minute,
                burst: hc.max_lookups_per_user_per_minute,
                global_per_second: 0,
                max_keys: config.rate_limit.max_keys,
            }),
        }))
    }

    /// The answer for `sub` in `vault`, from the cache or one bridge call made with the
    /// caller's `authorization` header verbatim, for the caller on client connection
    /// `conn`. Successes are cached for
    /// `hosted_context.cache_ttl_seconds`, failures for
    /// `hosted_context.failure_cache_ttl_seconds`; a call beyond the caller's budget is
    /// not made ([`HostedError::Throttled`], not cached).
    pub async fn lookup(
        &self,
        authorization: &HeaderValue,
        sub: &str,
        vault: &str,
        conn: ConnId,
    ) -> Result<(Arc<HostedAccess>, Source), HostedError> {
        // The hosted-context lookup phase; where the answer came from is its only
        // attribute.
        let span = tracing::trace_span!(
            target: crate::telemetry::trace::TARGET,
            "hosted_context",
            source = tracing::field::Empty,
        );
        if let Some(hit) = self.lock_cache().get(sub, vault, Instant::now()) {
            span.record("source", "cached");
            return hit.map(|access| (access, Source::Cached));
        }
        self.calls.check(sub).map_err(HostedError::Throttled)?;
        span.record("source", "fetched");
        let caller = Caller::Principal {
            sub,
            scope: vault,
            conn,
        };
        let fetched = self
            .fetch(authorization, vault, caller)
            .instrument(span)
            .await
            .map(Arc::new);
        self.lock_cache()
            .insert(sub, vault, fetched.clone(), Instant::now());
        fetched.map(|access| (access, Source::Fetched))
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        // The cache holds no invariant a panicking holder could break halfway.
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn fetch(
        &self,
        authorization: &HeaderValue,
        vault: &str,
        caller: Caller<'_>,
    ) -> Result<HostedAccess, HostedError> {
        let vault = HeaderValue::from_str(vault).map_err(|_| HostedError::Request)?;
        let mut request = Request::builder()
            .method(Method::GET)
            .uri(self.uri.clone())
            .header(http::header::AUTHORIZATION, authorization.clone())
            .header(http::header::ACCEPT, "application/json")
            .header("x-vault-id", vault)
            .body(Empty::new())
            .map_err(|_| HostedError::Request)?;
        if let Some(host) = &self.host {
            request
                .headers_mut()
                .insert(http::header::HOST, host.clone());
        }
        // The lookup belongs to the caller's request: the gateway can follow it by the
        // same id.
        if let Some(id) = crate::telemetry::request_id::current() {
            request
                .headers_mut()
                .insert(crate::telemetry::request_id::HEADER, id);
        }
        let call = async {
            let response = self
                .client
                .request(request, caller)
                .await
                .map_err(|_| HostedError::Transport)?;
            let status = response.status();
            if status == StatusCode::FORBIDDEN {
                return Err(HostedError::Forbidden);
            }
            if !status.is_success() {
                return Err(HostedError::Status(status.as_u16()));
            }
            let body = Limited::new(response.into_body(), MAX_BRIDGE_BODY_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        HostedError::TooLarge
                    } else {
                        HostedError::Transport
                    }
                })?
                .to_bytes();
            HostedAccess::from_json(&body).ok_or(HostedError::Malformed)
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| HostedError::Timeout)?
    }
}

/// A client for `uri` with the `[upstream]` pool settings, a pool for each of the
/// configuration's workers, its faults told to `observer`; an unusable URL is an error
/// of `key`.
pub(crate) fn pooled_client(
    uri: &Uri,
    connector: &Connector,
    config: &config::Config,
    observer: Observer,
    key: &str,
) -> Result<upstream::Client, ConfigError> {
    let settings = upstream::PoolSettings::new(&config.upstream)
        .for_workers(crate::worker::count_here(config.runtime.threads));
    upstream::Client::new(uri, connector, settings, observer)
        .map_err(|e| ConfigError::new(key, e.to_string()))
}

/// `base` with one trailing `/` stripped, then `path` (wire contract §4): `None` unless
/// an absolute http(s) URL without query or fragment.
pub(crate) fn endpoint(base: &str, path: &str) -> Option<Uri> {
    let base = base.strip_suffix('/').unwrap_or(base);
    if base.contains(['?', '#']) {
        return None;
    }
    let uri: Uri = format!("{base}{path}").parse().ok()?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    (scheme_ok && uri.authority().is_some()).then_some(uri)
}

/// What a lookup ended with.
type Answer = Result<Arc<HostedAccess>, HostedError>;

/// Answers per `sub` + vault (successes and, for a shorter time, failures), bounded by
/// count and bytes; oldest out first.
struct Cache {
    ttl: Duration,
    failure_ttl: Duration,
    max_entries: usize,
    max_bytes: usize,
    bytes: usize,
    next_gen: u64,
    map: HashMap<(String, String), Entry>,
    /// Insertion order; an element whose generation no longer matches the map is stale.
    order: VecDeque<((String, String), u64)>,
}

struct Entry {
    value: Answer,
    expires: Instant,
    generation: u64,
    weight: usize,
}

impl Cache {
    fn new(ttl: Duration, max_entries: usize, max_bytes: usize) -> Cache {
        Cache {
            ttl,
            failure_ttl: Duration::ZERO,
            max_entries,
            max_bytes,
            bytes: 0,
            next_gen: 0,
            map: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn with_failure_ttl(mut self, ttl: Duration) -> Cache {
        self.failure_ttl = ttl;
        self
    }

    fn get(&self, sub: &str, vault: &str, now: Instant) -> Option<Answer> {
        let e = self.map.get(&(sub.to_owned(), vault.to_owned()))?;
        (now < e.expires).then(|| e.value.clone())
    }

    fn insert(&mut self, sub: &str, vault: &str, value: Answer, now: Instant) {
        // A throttled lookup never gets here: it made no call and is not remembered.
        let ttl = if value.is_ok() {
            self.ttl
        } else {
            self.failure_ttl
        };
        if ttl.is_zero() || self.max_entries == 0 {
            return;
        }
        let key = (sub.to_owned(), vault.to_owned());
        let answer_weight = value.as_ref().map_or(0, |a| a.weight());
        let weight = answer_weight + 2 * (sub.len() + vault.len()) + 64;
        if weight > self.max_bytes {
            return;
        }
        if let Some(old) = self.map.remove(&key) {
            self.bytes -= old.weight;
        }
        // Drop the expired and then the oldest from the front until the new entry fits
        // (failures expire sooner, so an expired one may wait behind a live success; it
        // is never served and still counts against the bounds).
        while let Some((front, generation)) = self.order.front() {
            let live = self.map.get(front).filter(|e| e.generation == *generation);
            let must_go = match live {
                None => true,
                Some(e) => {
                    now >= e.expires
                        || self.map.len() >= self.max_entries
                        || self.bytes + weight > self.max_bytes
                }
            };
            if !must_go {
                break;
            }
            if let Some((k, g)) = self.order.pop_front() {
                if self.map.get(&k).is_some_and(|e| e.generation == g) {
                    if let Some(e) = self.map.remove(&k) {
                        self.bytes -= e.weight;
                    }
                }
            }
        }
        let generation = self.next_gen;
        self.next_gen += 1;
        self.order.push_back((key.clone(), generation));
        self.map.insert(
            key,
            Entry {
                value,
                expires: now + ttl,
                generation,
                weight,
            },
        );
        self.bytes += weight;
        // Re-inserted keys leave stale order entries behind; compact when they pile up.
        if self.order.len() > 2 * self.map.len() + 16 {
            let map = &self.map;
            self.order
                .retain(|(k, g)| map.get(k).is_some_and(|e| e.generation == *g));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Parses `v`, adding an empty `allowed_vault_ids` when it has none (the field the
    /// tests below are not about).
    fn access(mut v: Value) -> Option<HostedAccess> {
        if let Some(o) = v.as_object_mut() {
            o.entry("allowed_vault_ids").or_insert(json!([]));
        }
        HostedAccess::from_json(v.to_string().as_bytes())
    }

    #[test]
    fn s2_answer_fields_are_read() {
        let a = access(json!({
            "effective_canister_user_id": "google:owner",
            "allowed_vault_ids": ["vault-rest"],
            "scope": null,
            "role": "viewer",
        }))
        .unwrap();
        assert_eq!(a.rest_effective_user("google:actor"), "google:owner");
        assert_eq!(a.allowed_vault_ids, Some(vec!["vault-rest".to_owned()]));
        assert!(a.vault_allowed("vault-rest"));
        assert!(!a.vault_allowed("default"));
        assert_eq!(a.scope, None);
        assert_eq!(a.mcp_role(), "viewer");
    }

    #[test]
    fn s2_effective_user_rules_per_surface() {
        let a = |id: Value| access(json!({"effective_canister_user_id": id})).unwrap();
        assert_eq!(a(json!("")).rest_effective_user("s"), "s");
        assert_eq!(a(json!(" ")).rest_effective_user("s"), " ");
        assert_eq!(a(json!(" ")).mcp_effective_user("s"), "s");
        assert_eq!(a(json!(" o ")).mcp_effective_user("s"), "o");
        assert_eq!(access(json!({})).unwrap().rest_effective_user("s"), "s");
        assert_eq!(access(json!({})).unwrap().mcp_role(), "viewer");
        assert_eq!(access(json!({"role": ""})).unwrap().mcp_role(), "viewer");
        assert_eq!(
            access(json!({"role": "editor"})).unwrap().mcp_role(),
            "editor"
        );
    }

    #[test]
    fn s2_a_2xx_answer_counts_only_as_a_well_formed_context() {
        let raw = |v: Value| HostedAccess::from_json(v.to_string().as_bytes());
        // The real bridge's error shape, sent with a 2xx by mistake or by an impostor.
        assert_eq!(raw(json!({"error": "x", "code": "FORBIDDEN"})), None);
        for ids in [
            json!(null),
            json!("default"),
            json!({"0": "x"}),
            json!(["x", 5]),
            json!([null]),
        ] {
            assert_eq!(raw(json!({ "allowed_vault_ids": ids })), None, "{ids}");
        }
        for id in [json!(5), json!(null), json!(["a"]), json!({})] {
            assert_eq!(
                raw(json!({"allowed_vault_ids": [], "effective_canister_user_id": id})),
                None,
                "{id}"
            );
        }
        assert!(!access(json!({"allowed_vault_ids": []}))
            .unwrap()
            .vault_allowed("default"));
    }

    #[test]
    fn s2_malformed_answers_are_refused() {
        for bad in [&b"[]"[..], b"null", b"\"x\"", b"{", b"", b"<html>"] {
            assert_eq!(HostedAccess::from_json(bad), None);
        }
        assert_eq!(access(json!({"scope": "all"})), None);
        assert_eq!(access(json!({"scope": ["a"]})), None);
    }

    fn scope(v: Value) -> Scope {
        access(json!({ "scope": v })).unwrap().scope.unwrap()
    }

    #[test]
    fn s5_scope_filter_is_off_without_entries() {
        for s in [
            json!({}),
            json!({"projects": [], "folders": []}),
            json!({"projects": null}),
        ] {
            let s = scope(s);
            assert!(!s.is_active());
            assert!(s.allows("anything", None));
        }
    }

    #[test]
    fn s5_scope_folder_rule() {
        let s = scope(json!({"folders": ["notes", "a/b", "", "x/"]}));
        assert!(s.allows("notes", None));
        assert!(s.allows("notes/deep", None));
        assert!(s.allows("a/b/c", None));
        // `""` matches top level only; `"x/"` (not normalized) needs `x//…`.
        assert!(s.allows("", None));
        assert!(!s.allows("x", None));
        assert!(!s.allows("notesy", None));
        assert!(!s.allows("a", None));
        assert!(!s.allows("Notes", None));
        assert!(!s.allows("other/notes", None));
    }

    #[test]
    fn s5_scope_project_rule_is_strict_equality_of_a_truthy_value() {
        let s = scope(json!({"projects": ["alpha", 7, true, 0, "", null, ["alpha"], {"a": 1}]}));
        let yes = |p: FmValue| assert!(s.allows("elsewhere", Some(&p)), "{p:?}");
        let no = |p: FmValue| assert!(!s.allows("elsewhere", Some(&p)), "{p:?}");
        yes(FmValue::String("alpha".into()));
        yes(FmValue::Number(7.0));
        yes(FmValue::Bool(true));
        no(FmValue::String("Alpha".into()));
        no(FmValue::String(" alpha".into()));
        no(FmValue::String("7".into()));
        no(FmValue::Number(0.0));
        no(FmValue::String(String::new()));
        no(FmValue::Bool(false));
        no(FmValue::Null);
        no(FmValue::Number(f64::NAN));
        no(FmValue::Array(vec![FmValue::String("alpha".into())]));
        no(FmValue::Object {
            has_own_to_string: false,
        });
        assert!(!s.allows("elsewhere", None));
    }

    #[test]
    fn s5_unreadable_scope_lists_allow_nothing() {
        let s = scope(json!({"projects": "alpha", "folders": null}));
        assert!(s.is_active());
        assert!(!s.allows("", Some(&FmValue::String("alpha".into()))));
        let s = scope(json!({"folders": [5]}));
        assert!(s.is_active());
        assert!(!s.allows("5", None));
    }

    fn entry() -> Answer {
        Ok(Arc::new(
            access(json!({"role": "viewer", "allowed_vault_ids": []})).unwrap(),
        ))
    }

    #[test]
    fn s2_cache_serves_within_ttl_only() {
        let t0 = Instant::now();
        let mut c = Cache::new(Duration::from_secs(60), 10, MAX_CACHE_BYTES);
        c.insert("u", "v", entry(), t0);
        assert!(c.get("u", "v", t0 + Duration::from_secs(59)).is_some());
        assert!(c.get("u", "v", t0 + Duration::from_secs(60)).is_none());
        assert!(c.get("u", "w", t0).is_none());
        assert!(c.get("w", "v", t0).is_none());
    }

    #[test]
    fn s2_cache_is_bounded_oldest_first() {
        let t0 = Instant::now();
        let mut c = Cache::new(Duration::from_secs(60), 3, MAX_CACHE_BYTES);
        for (i, u) in ["a", "b", "c", "d"].iter().enumerate() {
            c.insert(u, "v", entry(), t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(c.len(), 3);
        assert!(c.get("a", "v", t0).is_none());
        assert!(c.get("d", "v", t0).is_some());
        // Expired entries go first, whatever the count.
        c.insert("e", "v", entry(), t0 + Duration::from_secs(61));
        assert_eq!(c.len(), 1);
        // Re-inserting one key many times keeps the order queue compact.
        for i in 0..1000 {
            c.insert(
                "e",
                "v",
                entry(),
                t0 + Duration::from_secs(61) + Duration::from_millis(i),
            );
        }
        assert_eq!(c.len(), 1);
        assert!(c.order.len() <= 2 * c.map.len() + 16);
    }

    #[test]
    fn s2_cache_byte_budget_and_disabled_cache() {
        let t0 = Instant::now();
        let mut c = Cache::new(Duration::from_secs(60), 1000, 2_000);
        for i in 0..100 {
            c.insert(&format!("user-{i}"), "v", entry(), t0);
        }
        assert!(c.bytes <= 2_000);
        assert!(c.len() < 100 && c.len() > 0);
        let huge = "x".repeat(10_000);
        c.insert(&huge, "v", entry(), t0);
        assert!(c.get(&huge, "v", t0).is_none());

        let mut off = Cache::new(Duration::ZERO, 10, MAX_CACHE_BYTES);
        off.insert("u", "v", entry(), t0);
        assert_eq!(off.len(), 0);
        let mut off = Cache::new(Duration::from_secs(1), 0, MAX_CACHE_BYTES);
        off.insert("u", "v", entry(), t0);
        assert_eq!(off.len(), 0);
    }

    #[test]
    fn s4_endpoint_strips_one_trailing_slash() {
        let e = |b: &str| endpoint(b, "/api/v1/x").map(|u| u.to_string());
        assert_eq!(e("http://h:1"), Some("http://h:1/api/v1/x".into()));
        assert_eq!(e("http://h:1/"), Some("http://h:1/api/v1/x".into()));
        assert_eq!(
            e("http://h:1/base/"),
            Some("http://h:1/base/api/v1/x".into())
        );
        assert_eq!(e("http://h:1//"), Some("http://h:1//api/v1/x".into()));
        assert_eq!(e("ftp://h"), None);
        assert_eq!(e("/relative"), None);
        assert_eq!(e("http://h/?q=1"), None);
        assert_eq!(e("not a url"), None);
    }
}
