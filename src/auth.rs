//! Caller identity (wire contract §1): the bearer token, its kind and scopes, and the
//! active vault.
//!
//! Verification happens in two stages because the REST status table (§5) answers an
//! `agent_access` token that lacks the vault with 403 *before* any other identity check:
//! [`verify_token`] checks the signature and the time claims and yields a
//! [`VerifiedToken`]; [`VerifiedToken::agent_vault_allowed`] is the agent vault gate;
//! [`VerifiedToken::identity`] applies the remaining rules (subject, kind, agent claims,
//! scopes). [`verify`] runs both identity stages for callers without the vault gate.
//!
//! Decisions where the contract is silent, each the gateway's own behaviour unless
//! marked stricter:
//! - `scopes` must be a JSON array; its string entries are compared exactly and anything
//!   else in it is ignored. A space-separated string is *not* split: the gateway tests
//!   `Array.isArray(scopes)`, so such a token has no scopes and is refused.
//! - The scope rule applies to `mcp_access` and `agent_access` tokens only. Hub login
//!   tokens carry no scopes (the gateway derives their role elsewhere), so applying it to
//!   them would refuse every Hub user.
//! - `type: null` counts as an absent `type` (a Hub login), as the gateway's own token
//!   classifier treats it.
//! - `vault_ids` entries that are not strings are ignored (stricter: the gateway
//!   stringifies them), and a `vault_ids` that is not an array allows no vault.
//! - More than one `Authorization` header is refused (Node keeps the first one).
//! - `exp` and `nbf` are checked here with JavaScript's rules (`now >= exp` is expired,
//!   `nbf > now` is not yet valid, a present non-number is invalid), not by the JWT
//!   crate, which rounds fractional values and allows `now == exp`.
//!
//! A key set remembers the tokens it verified (`verified`): the signature and decoding
//! are skipped for a token seen before, the time claims never are.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, Method};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::config;
use crate::js;
use crate::telemetry::TokenRefusal;

mod verified;

use verified::{Claims, Verified};

/// The `aud` an `agent_access` token must carry (wire contract §1).
pub const AGENT_AUDIENCE: &str = "knowtation-hub-rest";

/// The payload `typ` an `agent_access` token must carry (wire contract §1).
pub const AGENT_TYP: &str = "kt_agent_access";

/// The vault used when `X-Vault-Id` is absent or blank (wire contract §1).
pub const DEFAULT_VAULT: &str = "default";

/// Longest vault id accepted (wire contract §1 Deviation).
pub const MAX_VAULT_ID_BYTES: usize = 64;

/// The kind of token, from the payload claim `type` (wire contract §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenKind {
    /// `type` absent or `session`: a Hub login.
    Session,
    /// `type: mcp_access`: an MCP OAuth token with `scopes`.
    McpAccess,
    /// `type: agent_access`: an agent credential bound to `vault_ids`.
    AgentAccess,
}

/// Who is calling, after every §1 rule passed.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    /// The claim `sub`: a non-empty string.
    pub sub: String,
    /// The token kind.
    pub kind: TokenKind,
    /// An agent token's string `vault_ids`; `None` for other kinds.
    pub vault_ids: Option<Vec<String>>,
}

impl fmt::Debug for Identity {
    // A user id is never printed (it could end up in a log line).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("sub", &"<redacted>")
            .field("kind", &self.kind)
            .field("vault_ids", &self.vault_ids.as_ref().map(Vec::len))
            .finish()
    }
}

/// Why a caller was not identified. Every variant is a 401 on the wire; the variants
/// exist for tests and for the agent vault gate's ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header.
    #[error("no authorization header")]
    Missing,
    /// Not exactly one header, not text, or not `Bearer <token>`.
    #[error("authorization header is not a bearer token")]
    NotBearer,
    /// Malformed token or unsupported algorithm.
    #[error("token is malformed")]
    InvalidToken,
    /// A well-formed token no configured secret verifies.
    #[error("token signature does not verify")]
    BadSignature,
    /// No secret is configured, so no token verifies.
    #[error("no secret to verify the token with")]
    NoKey,
    /// `exp` or `nbf` present but not a number.
    #[error("token has a malformed time claim")]
    InvalidTimeClaim,
    /// `exp` is absent and the configuration requires it.
    #[error("token has no expiry")]
    MissingExp,
    /// `now >= exp`.
    #[error("token has expired")]
    Expired,
    /// `nbf > now`.
    #[error("token is not yet valid")]
    NotYetValid,
    /// `sub` missing, empty or not a string.
    #[error("token has no usable subject")]
    MissingSub,
    /// `type` is not one of the known kinds.
    #[error("token type is unknown")]
    UnknownType,
    /// An agent token without the agent `aud` and `typ`.
    #[error("agent token has the wrong audience or typ")]
    AgentClaims,
    /// The scopes do not allow the HTTP method.
    #[error("token scopes do not allow this method")]
    InsufficientScope,
}

impl AuthError {
    /// The closed reason the metric and the access line carry.
    pub fn refusal(self) -> TokenRefusal {
        match self {
            AuthError::Missing => TokenRefusal::Missing,
            AuthError::NotBearer
            | AuthError::InvalidToken
            | AuthError::InvalidTimeClaim
            | AuthError::MissingSub => TokenRefusal::Malformed,
            AuthError::BadSignature => TokenRefusal::BadSignature,
            AuthError::NoKey => TokenRefusal::UnknownKey,
            AuthError::MissingExp => TokenRefusal::NoExpiry,
            AuthError::Expired => TokenRefusal::Expired,
            AuthError::NotYetValid => TokenRefusal::NotYetValid,
            AuthError::UnknownType | AuthError::AgentClaims => TokenRefusal::WrongKind,
            AuthError::InsufficientScope => TokenRefusal::InsufficientScope,
        }
    }

    /// The `WWW-Authenticate` value of a 401 for this refusal (RFC 6750 §3): no error
    /// code when no credentials came, else the code and a fixed description; never
    /// anything of the token. A missing key reads as a signature that does not verify:
    /// the caller learns nothing of the configuration.
    pub fn challenge(self) -> &'static str {
        match self {
            AuthError::Missing => "Bearer",
            AuthError::NotBearer => {
                r#"Bearer error="invalid_request", error_description="expected one Authorization header: Bearer <token>""#
            }
            AuthError::InvalidToken => {
                r#"Bearer error="invalid_token", error_description="the token is malformed""#
            }
            AuthError::BadSignature | AuthError::NoKey => {
                r#"Bearer error="invalid_token", error_description="the signature does not verify""#
            }
            AuthError::InvalidTimeClaim => {
                r#"Bearer error="invalid_token", error_description="a time claim is not a number""#
            }
            AuthError::MissingExp => {
                r#"Bearer error="invalid_token", error_description="the token has no expiry""#
            }
            AuthError::Expired => {
                r#"Bearer error="invalid_token", error_description="the token has expired""#
            }
            AuthError::NotYetValid => {
                r#"Bearer error="invalid_token", error_description="the token is not yet valid""#
            }
            AuthError::MissingSub => {
                r#"Bearer error="invalid_token", error_description="the token has no subject""#
            }
            AuthError::UnknownType | AuthError::AgentClaims => {
                r#"Bearer error="invalid_token", error_description="the token is of the wrong kind""#
            }
            AuthError::InsufficientScope => {
                r#"Bearer error="insufficient_scope", error_description="the scopes of the token do not allow this method""#
            }
        }
    }
}

/// The verification secrets, in order (primary first), the `exp` policy, and the
/// tokens these secrets already verified (`verified`): clones share them, a key set
/// built anew (a reload) starts empty.
#[derive(Clone)]
pub struct Keys {
    keys: Vec<DecodingKey>,
    require_exp: bool,
    verified: Arc<Verified>,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keys")
            .field("count", &self.keys.len())
            .field("require_exp", &self.require_exp)
            .field("cached_tokens", &self.verified.len())
            .finish()
    }
}

impl Keys {
    /// Builds the keys from `auth.jwt_secrets` (the loader has already appended the
    /// secrets file): empty secrets and repeats of an earlier one are ignored, as the
    /// gateway ignores an empty or primary-equal previous secret.
    pub fn new(auth: &config::Auth) -> Keys {
        Keys::from_secrets(
            auth.jwt_secrets.iter().map(config::Secret::expose),
            auth.require_exp,
        )
        .with_token_cache(auth.token_cache_entries)
    }

    /// Builds the keys from secret strings in order, remembering up to
    /// [`config::DEFAULT_TOKEN_CACHE_ENTRIES`] verified tokens.
    pub fn from_secrets<'a>(secrets: impl IntoIterator<Item = &'a str>, require_exp: bool) -> Keys {
        let mut seen = HashSet::new();
        let keys = secrets
            .into_iter()
            .filter(|s| !s.is_empty() && seen.insert(*s))
            .map(|s| DecodingKey::from_secret(s.as_bytes()))
            .collect();
        Keys {
            keys,
            require_exp,
            verified: Arc::new(Verified::new(config::DEFAULT_TOKEN_CACHE_ENTRIES)),
        }
    }

    /// The same secrets, remembering at most `entries` verified tokens (`0`: none) in a
    /// cache of their own.
    pub fn with_token_cache(self, entries: usize) -> Keys {
        Keys {
            verified: Arc::new(Verified::new(entries)),
            ..self
        }
    }

    /// How many verified tokens are remembered.
    pub fn cached_tokens(&self) -> usize {
        self.verified.len()
    }

    /// How many distinct secrets verify tokens.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no secret is configured (every token is then refused).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// A token whose signature and time claims passed; not yet an [`Identity`].
#[derive(Clone)]
pub struct VerifiedToken {
    claims: Claims,
    remembered: bool,
}

impl fmt::Debug for VerifiedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifiedToken").finish_non_exhaustive()
    }
}

impl VerifiedToken {
    /// Whether the signature check was remembered from an earlier request rather than
    /// computed for this one.
    pub fn remembered(&self) -> bool {
        self.remembered
    }

    /// The `sub` claim, when it is a non-empty string.
    pub fn sub(&self) -> Option<&str> {
        self.claims
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    }

    /// Whether the payload `type` is `agent_access`.
    pub fn is_agent(&self) -> bool {
        self.claims.get("type").and_then(Value::as_str) == Some("agent_access")
    }

    /// The agent vault gate (wire contract §5, first row): `false` only for an agent
    /// token whose `vault_ids` lacks `vault` (the trimmed `X-Vault-Id`, or `default`).
    pub fn agent_vault_allowed(&self, vault: &str) -> bool {
        !self.is_agent() || string_entries(self.claims.get("vault_ids")).any(|v| v == vault)
    }

    /// The remaining §1 rules: `sub`, the kind, an agent's `aud`/`typ`, then the scope
    /// rule for `method` (MCP and agent tokens only).
    pub fn identity(self, method: &Method) -> Result<Identity, AuthError> {
        let sub = match self.claims.get("sub") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err(AuthError::MissingSub),
        };
        let kind = match self.claims.get("type") {
            None | Some(Value::Null) => TokenKind::Session,
            Some(Value::String(t)) => match t.as_str() {
                "session" => TokenKind::Session,
                "mcp_access" => TokenKind::McpAccess,
                "agent_access" => TokenKind::AgentAccess,
                _ => return Err(AuthError::UnknownType),
            },
            Some(_) => return Err(AuthError::UnknownType),
        };
        if kind == TokenKind::AgentAccess
            && (self.claims.get("aud").and_then(Value::as_str) != Some(AGENT_AUDIENCE)
                || self.claims.get("typ").and_then(Value::as_str) != Some(AGENT_TYP))
        {
            return Err(AuthError::AgentClaims);
        }
        if kind != TokenKind::Session && !scopes_permit(self.claims.get("scopes"), method) {
            return Err(AuthError::InsufficientScope);
        }
        let vault_ids = (kind == TokenKind::AgentAccess).then(|| {
            string_entries(self.claims.get("vault_ids"))
                .map(str::to_owned)
                .collect()
        });
        Ok(Identity {
            sub,
            kind,
            vault_ids,
        })
    }
}

/// The string entries of a JSON array claim; nothing for any other value.
fn string_entries(v: Option<&Value>) -> impl Iterator<Item = &str> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// The scope rule of §1: safe methods need a read, write or admin scope; any other
/// method a write or admin scope.
fn scopes_permit(scopes: Option<&Value>, method: &Method) -> bool {
    let has = |wanted: &[&str]| string_entries(scopes).any(|s| wanted.contains(&s));
    if is_safe_method(method) {
        has(&["vault:read", "vault:write", "vault:admin", "admin"])
    } else {
        has(&["vault:write", "vault:admin", "admin"])
    }
}

/// GET, HEAD and OPTIONS never mutate (§1).
fn is_safe_method(method: &Method) -> bool {
    *method == Method::GET || *method == Method::HEAD || *method == Method::OPTIONS
}

/// The caller's `Authorization` value: `Ok(None)` when absent, an error when repeated or
/// not text.
pub fn authorization(headers: &HeaderMap) -> Result<Option<&str>, AuthError> {
    let mut values = headers.get_all(http::header::AUTHORIZATION).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(AuthError::NotBearer);
    }
    first.to_str().map(Some).map_err(|_| AuthError::NotBearer)
}

/// Verifies signature and time claims (§1): `Bearer ` (case-sensitive, one space), an
/// HS256/HS384/HS512 JWT signed by one of `keys` in order, `exp`/`nbf` with no leeway
/// at `now` (Unix seconds), `exp` required when configured. No issuer or audience check.
pub fn verify_token(
    authorization: Option<&str>,
    keys: &Keys,
    now: u64,
) -> Result<VerifiedToken, AuthError> {
    // The authenticate phase; a refusal's reason is its only attribute.
    let span = tracing::trace_span!(
        target: crate::telemetry::trace::TARGET,
        "authenticate",
        auth_reason = tracing::field::Empty,
    );
    let _entered = span.enter();
    let verified = verify_header(authorization, keys, now);
    if let Err(e) = &verified {
        span.record("auth_reason", e.refusal().as_str());
    }
    verified
}

/// [`verify_token`] itself.
fn verify_header(
    authorization: Option<&str>,
    keys: &Keys,
    now: u64,
) -> Result<VerifiedToken, AuthError> {
    let header = authorization.ok_or(AuthError::Missing)?;
    let token = header.strip_prefix("Bearer ").ok_or(AuthError::NotBearer)?;
    let key = keys.verified.key(token);
    if let Some(claims) = key.as_ref().and_then(|k| keys.verified.get(k)) {
        // Remembered: the signature passed under these secrets; time moves on.
        check_times(&claims, keys.require_exp, now)?;
        return Ok(VerifiedToken {
            claims,
            remembered: true,
        });
    }
    let claims = Arc::new(decode_any(token, keys)?);
    check_times(&claims, keys.require_exp, now)?;
    if let Some(key) = key {
        keys.verified.insert(key, Arc::clone(&claims));
    }
    Ok(VerifiedToken {
        claims,
        remembered: false,
    })
}

/// Every §1 rule except the agent vault gate: [`verify_token`] then
/// [`VerifiedToken::identity`].
pub fn verify(
    authorization: Option<&str>,
    method: &Method,
    keys: &Keys,
    now: u64,
) -> Result<Identity, AuthError> {
    verify_token(authorization, keys, now)?.identity(method)
}

/// The current Unix time in whole seconds (JavaScript's `Math.floor(Date.now() / 1000)`).
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Tries each key in order; only a bad signature moves on to the next key.
fn decode_any(token: &str, keys: &Keys) -> Result<Map<String, Value>, AuthError> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.algorithms = vec![Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];
    // Time claims are checked by `check_times`, with JavaScript's comparisons.
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    validation.leeway = 0;
    if keys.keys.is_empty() {
        return Err(AuthError::NoKey);
    }
    for key in &keys.keys {
        match jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation) {
            Ok(data) => return Ok(data.claims),
            Err(e) if *e.kind() == ErrorKind::InvalidSignature => continue,
            Err(_) => return Err(AuthError::InvalidToken),
        }
    }
    Err(AuthError::BadSignature)
}

/// `exp` and `nbf` as the gateway's `jsonwebtoken` package checks them, no clock tolerance.
fn check_times(claims: &Map<String, Value>, require_exp: bool, now: u64) -> Result<(), AuthError> {
    let now = now as f64;
    if let Some(nbf) = claims.get("nbf") {
        let nbf = nbf.as_f64().ok_or(AuthError::InvalidTimeClaim)?;
        if nbf > now {
            return Err(AuthError::NotYetValid);
        }
    }
    match claims.get("exp") {
        Some(exp) => {
            let exp = exp.as_f64().ok_or(AuthError::InvalidTimeClaim)?;
            if now >= exp {
                return Err(AuthError::Expired);
            }
        }
        None if require_exp => return Err(AuthError::MissingExp),
        None => {}
    }
    Ok(())
}

/// Why `X-Vault-Id` was refused (400 `INVALID_VAULT` on REST).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid vault id")]
pub struct VaultError;

/// The requested vault (§1): the `X-Vault-Id` value JavaScript-trimmed, `default` when
/// absent or blank. Repeated headers and non-text values are refused; the shape is
/// checked separately by [`validate_vault`] so the agent gate can run first.
pub fn requested_vault(headers: &HeaderMap) -> Result<String, VaultError> {
    let mut values = headers.get_all("x-vault-id").iter();
    let Some(first) = values.next() else {
        return Ok(DEFAULT_VAULT.to_owned());
    };
    if values.next().is_some() {
        return Err(VaultError);
    }
    let text = first.to_str().map_err(|_| VaultError)?;
    match js::trim(text) {
        "" => Ok(DEFAULT_VAULT.to_owned()),
        t => Ok(t.to_owned()),
    }
}

/// The §1 Deviation: a vault id must match `^[A-Za-z0-9_-]{1,64}$`.
pub fn validate_vault(vault: &str) -> Result<(), VaultError> {
    let ok = !vault.is_empty()
        && vault.len() <= MAX_VAULT_ID_BYTES
        && vault
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(VaultError)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    const NOW: u64 = 1_700_000_000;
    const PRIMARY: &str = "primary-secret-0123456789abcdef01";
    const PREVIOUS: &str = "previous-secret-0123456789abcdef0";

    fn sign_alg(alg: Algorithm, secret: &str, claims: Value) -> String {
        jsonwebtoken::encode(
            &Header::new(alg),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    fn bearer(secret: &str, claims: Value) -> String {
        format!("Bearer {}", sign_alg(Algorithm::HS256, secret, claims))
    }

    fn keys() -> Keys {
        Keys::from_secrets([PRIMARY, PREVIOUS], true)
    }

    fn get(h: &str) -> Result<Identity, AuthError> {
        verify(Some(h), &Method::GET, &keys(), NOW)
    }

    fn post(h: &str) -> Result<Identity, AuthError> {
        verify(Some(h), &Method::POST, &keys(), NOW)
    }

    fn session() -> Value {
        json!({"sub": "google:1", "exp": NOW + 60})
    }

    #[test]
    fn s1_session_token_is_identified_by_sub() {
        let id = get(&bearer(PRIMARY, session())).unwrap();
        assert_eq!(id.sub, "google:1");
        assert_eq!(id.kind, TokenKind::Session);
        assert_eq!(id.vault_ids, None);
        let id = get(&bearer(
            PRIMARY,
            json!({"sub": "u", "exp": NOW + 1, "type": "session"}),
        ));
        assert_eq!(id.unwrap().kind, TokenKind::Session);
        let id = get(&bearer(
            PRIMARY,
            json!({"sub": "u", "exp": NOW + 1, "type": null}),
        ));
        assert_eq!(id.unwrap().kind, TokenKind::Session);
    }

    #[test]
    fn remembered_tokens_are_checked_against_the_clock_every_time() {
        let k = keys();
        let h = bearer(PRIMARY, json!({"sub": "u", "exp": NOW + 10}));
        let at = |now| verify(Some(&h), &Method::GET, &k, now);
        assert!(at(NOW).is_ok());
        assert_eq!(k.cached_tokens(), 1);
        assert_eq!(at(NOW + 10), Err(AuthError::Expired));
        assert!(at(NOW + 9).is_ok());
        let early = bearer(
            PRIMARY,
            json!({"sub": "u", "exp": NOW + 99, "nbf": NOW + 5}),
        );
        let at = |now| verify(Some(&early), &Method::GET, &k, now);
        assert_eq!(at(NOW), Err(AuthError::NotYetValid));
        assert_eq!(k.cached_tokens(), 1, "stored before it was valid");
        assert!(at(NOW + 5).is_ok());
        assert_eq!(k.cached_tokens(), 2);
        assert_eq!(at(NOW + 4), Err(AuthError::NotYetValid));
    }

    #[test]
    fn only_tokens_that_pass_are_remembered() {
        let k = keys();
        let token = sign_alg(Algorithm::HS256, PRIMARY, session());
        let (head, _) = token.rsplit_once('.').unwrap();
        for h in [
            bearer("other", session()),
            bearer(PRIMARY, json!({"sub": "u", "exp": NOW})),
            bearer(PRIMARY, json!({"sub": "u"})),
            format!("Bearer {head}.AAAA"),
            "Bearer a.b.c".to_owned(),
            format!("bearer {token}"),
        ] {
            assert!(verify(Some(&h), &Method::GET, &k, NOW).is_err(), "{h}");
        }
        assert_eq!(k.cached_tokens(), 0);
        // A remembered token does not vouch for its header and payload under another
        // signature: the whole token is the key.
        assert!(verify(Some(&format!("Bearer {token}")), &Method::GET, &k, NOW).is_ok());
        assert_eq!(
            verify(Some(&format!("Bearer {head}.AAAA")), &Method::GET, &k, NOW),
            Err(AuthError::BadSignature)
        );
    }

    #[test]
    fn a_key_set_built_anew_remembers_nothing() {
        let k = keys();
        let h = bearer(PRIMARY, session());
        assert!(verify(Some(&h), &Method::GET, &k, NOW).is_ok());
        assert_eq!(
            k.clone().cached_tokens(),
            1,
            "clones share what is remembered"
        );
        // As after a reload that dropped the primary secret.
        let rotated = Keys::from_secrets([PREVIOUS], true);
        assert_eq!(rotated.cached_tokens(), 0);
        assert_eq!(
            verify(Some(&h), &Method::GET, &rotated, NOW),
            Err(AuthError::BadSignature)
        );
        let off = keys().with_token_cache(0);
        assert!(verify(Some(&h), &Method::GET, &off, NOW).is_ok());
        assert_eq!(off.cached_tokens(), 0);
    }

    proptest::proptest! {
        /// A remembered verification gives the verdict a fresh one gives, at any time.
        #[test]
        fn remembered_verdicts_equal_fresh_ones(
            exp in proptest::option::of(-20i64..20),
            nbf in proptest::option::of(-20i64..20),
            kind in 0usize..4,
            require_exp: bool,
            times in proptest::collection::vec(-30i64..30, 1..8),
        ) {
            let mut claims = json!({"sub": "u", "scopes": ["vault:read"]});
            if let Some(e) = exp {
                claims["exp"] = json!(NOW as i64 + e);
            }
            if let Some(n) = nbf {
                claims["nbf"] = json!(NOW as i64 + n);
            }
            claims["type"] = json!(["session", "mcp_access", "agent_access", "other"][kind]);
            let h = bearer(PRIMARY, claims);
            let shared = Keys::from_secrets([PRIMARY], require_exp);
            for t in times {
                let now = (NOW as i64 + t) as u64;
                let fresh = Keys::from_secrets([PRIMARY], require_exp).with_token_cache(0);
                proptest::prop_assert_eq!(
                    verify(Some(&h), &Method::GET, &shared, now),
                    verify(Some(&h), &Method::GET, &fresh, now)
                );
            }
        }
    }

    #[test]
    fn s1_all_three_hmac_algorithms_verify() {
        for alg in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
            let h = format!("Bearer {}", sign_alg(alg, PRIMARY, session()));
            assert!(get(&h).is_ok(), "{alg:?}");
        }
    }

    #[test]
    fn s1_bearer_prefix_is_case_sensitive_with_one_space() {
        let token = sign_alg(Algorithm::HS256, PRIMARY, session());
        for h in [
            format!("bearer {token}"),
            format!("BEARER {token}"),
            format!("Bearer  {token}"),
            format!("Bearer\t{token}"),
            format!("Basic {token}"),
            token.clone(),
            "Bearer ".to_owned(),
        ] {
            assert!(get(&h).is_err(), "{h}");
        }
        assert_eq!(
            verify(None, &Method::GET, &keys(), NOW),
            Err(AuthError::Missing)
        );
    }

    #[test]
    fn s1_previous_secret_verifies_and_unknown_secret_does_not() {
        assert!(get(&bearer(PREVIOUS, session())).is_ok());
        assert_eq!(
            get(&bearer("other", session())),
            Err(AuthError::BadSignature)
        );
    }

    #[test]
    fn s1_empty_and_duplicate_secrets_are_ignored() {
        let k = Keys::from_secrets(["", PRIMARY, PRIMARY, "", PREVIOUS], true);
        assert_eq!(k.len(), 2);
        // An empty secret never verifies a token signed with an empty key.
        let k = Keys::from_secrets([""], false);
        assert!(k.is_empty());
        let h = bearer("", json!({"sub": "u"}));
        assert_eq!(
            verify(Some(&h), &Method::GET, &k, NOW),
            Err(AuthError::NoKey)
        );
    }

    #[test]
    fn s1_unsigned_and_asymmetric_algorithms_are_refused() {
        // alg none: header {"alg":"none"} with an empty signature.
        let none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJ1IiwiZXhwIjo5OTk5OTk5OTk5fQ.";
        assert_eq!(get(&format!("Bearer {none}")), Err(AuthError::InvalidToken));
        assert_eq!(get("Bearer a.b.c"), Err(AuthError::InvalidToken));
        assert_eq!(get("Bearer not-a-jwt"), Err(AuthError::InvalidToken));
    }

    #[test]
    fn s1_exp_and_nbf_have_no_leeway() {
        let at = |claims: Value| get(&bearer(PRIMARY, claims));
        assert_eq!(at(json!({"sub": "u", "exp": NOW})), Err(AuthError::Expired));
        assert!(at(json!({"sub": "u", "exp": NOW + 1})).is_ok());
        assert!(at(json!({"sub": "u", "exp": NOW as f64 + 0.5})).is_ok());
        assert_eq!(
            at(json!({"sub": "u", "exp": NOW as f64 - 0.5})),
            Err(AuthError::Expired)
        );
        assert_eq!(
            at(json!({"sub": "u", "exp": NOW + 9, "nbf": NOW + 1})),
            Err(AuthError::NotYetValid)
        );
        assert!(at(json!({"sub": "u", "exp": NOW + 9, "nbf": NOW})).is_ok());
        assert_eq!(
            at(json!({"sub": "u", "exp": "9999999999"})),
            Err(AuthError::InvalidTimeClaim)
        );
        assert_eq!(
            at(json!({"sub": "u", "exp": null})),
            Err(AuthError::InvalidTimeClaim)
        );
        assert_eq!(
            at(json!({"sub": "u", "exp": NOW + 9, "nbf": "0"})),
            Err(AuthError::InvalidTimeClaim)
        );
    }

    #[test]
    fn s1_exp_is_required_unless_configured_otherwise() {
        let h = bearer(PRIMARY, json!({"sub": "u", "role": "viewer"}));
        assert_eq!(get(&h), Err(AuthError::MissingExp));
        let lax = Keys::from_secrets([PRIMARY], false);
        assert!(verify(Some(&h), &Method::GET, &lax, NOW).is_ok());
    }

    #[test]
    fn s1_sub_must_be_a_non_empty_string() {
        for sub in [json!(null), json!(""), json!(5), json!(true)] {
            let h = bearer(PRIMARY, json!({"sub": sub, "exp": NOW + 9}));
            assert_eq!(get(&h), Err(AuthError::MissingSub), "{sub}");
        }
        // The JWT crate's own claim reader refuses structured subjects outright.
        for sub in [json!(["u"]), json!({"a": 1})] {
            let h = bearer(PRIMARY, json!({"sub": sub, "exp": NOW + 9}));
            assert!(get(&h).is_err(), "{sub}");
        }
        let h = bearer(PRIMARY, json!({"exp": NOW + 9}));
        assert_eq!(get(&h), Err(AuthError::MissingSub));
    }

    #[test]
    fn s1_no_issuer_or_audience_check_for_non_agent_tokens() {
        let h = bearer(
            PRIMARY,
            json!({"sub": "u", "exp": NOW + 9, "iss": "elsewhere", "aud": ["x", "y"]}),
        );
        assert!(get(&h).is_ok());
    }

    #[test]
    fn s1_unknown_type_is_refused() {
        for t in [json!("admin"), json!("Session"), json!(1), json!(true)] {
            let h = bearer(PRIMARY, json!({"sub": "u", "exp": NOW + 9, "type": t}));
            assert_eq!(get(&h), Err(AuthError::UnknownType), "{t}");
        }
    }

    #[test]
    fn s1_role_claim_is_never_used() {
        for role in ["admin", "viewer", "none"] {
            let h = bearer(PRIMARY, json!({"sub": "u", "exp": NOW + 9, "role": role}));
            assert!(get(&h).is_ok());
            assert!(post(&h).is_ok());
        }
        let mcp = json!({"sub": "u", "exp": NOW + 9, "type": "mcp_access", "role": "admin", "scopes": []});
        assert_eq!(
            get(&bearer(PRIMARY, mcp)),
            Err(AuthError::InsufficientScope)
        );
    }

    #[test]
    fn s1_scope_rule_by_method_for_mcp_tokens() {
        let mcp = |scopes: Value| {
            bearer(
                PRIMARY,
                json!({"sub": "u", "exp": NOW + 9, "type": "mcp_access", "scopes": scopes}),
            )
        };
        for s in ["vault:read", "vault:write", "vault:admin", "admin"] {
            let id = get(&mcp(json!([s]))).unwrap();
            assert_eq!(id.kind, TokenKind::McpAccess);
            assert!(verify(Some(&mcp(json!([s]))), &Method::HEAD, &keys(), NOW).is_ok());
            assert!(verify(Some(&mcp(json!([s]))), &Method::OPTIONS, &keys(), NOW).is_ok());
        }
        // A read-only MCP token: accepted on GET, refused on POST (so on /mcp).
        assert_eq!(
            post(&mcp(json!(["vault:read"]))),
            Err(AuthError::InsufficientScope)
        );
        for s in ["vault:write", "vault:admin", "admin"] {
            assert!(post(&mcp(json!([s]))).is_ok());
        }
        for scopes in [
            json!([]),
            json!(null),
            json!(["VAULT:READ"]),
            json!(["vault:read "]),
            json!("vault:read"),
            json!("vault:read vault:write"),
            json!([["vault:read"]]),
        ] {
            assert_eq!(
                get(&mcp(scopes.clone())),
                Err(AuthError::InsufficientScope),
                "{scopes}"
            );
        }
        let no_scopes = bearer(
            PRIMARY,
            json!({"sub": "u", "exp": NOW + 9, "type": "mcp_access"}),
        );
        assert_eq!(get(&no_scopes), Err(AuthError::InsufficientScope));
    }

    fn agent(extra: Value) -> Value {
        let mut c = json!({
            "sub": "agent:1", "exp": NOW + 9, "type": "agent_access",
            "aud": AGENT_AUDIENCE, "typ": AGENT_TYP,
            "scopes": ["vault:read"], "vault_ids": ["default", "v2"],
        });
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    }

    #[test]
    fn s1_agent_tokens_need_aud_typ_and_scopes() {
        let id = get(&bearer(PRIMARY, agent(json!({})))).unwrap();
        assert_eq!(id.kind, TokenKind::AgentAccess);
        assert_eq!(
            id.vault_ids,
            Some(vec!["default".to_owned(), "v2".to_owned()])
        );
        for bad in [
            json!({"aud": "other"}),
            json!({"aud": [AGENT_AUDIENCE]}),
            json!({"aud": null}),
            json!({"typ": "JWT"}),
            json!({"typ": null}),
        ] {
            assert_eq!(
                get(&bearer(PRIMARY, agent(bad.clone()))),
                Err(AuthError::AgentClaims),
                "{bad}"
            );
        }
        assert_eq!(
            get(&bearer(PRIMARY, agent(json!({"scopes": ["propose"]})))),
            Err(AuthError::InsufficientScope)
        );
        assert_eq!(
            post(&bearer(PRIMARY, agent(json!({})))),
            Err(AuthError::InsufficientScope)
        );
    }

    #[test]
    fn s5_agent_vault_gate_runs_on_a_verified_token_before_other_checks() {
        let t = |extra: Value| {
            let h = bearer(PRIMARY, agent(extra));
            verify_token(Some(&h), &keys(), NOW).unwrap()
        };
        assert!(t(json!({})).agent_vault_allowed("default"));
        assert!(t(json!({})).agent_vault_allowed("v2"));
        assert!(!t(json!({})).agent_vault_allowed("v3"));
        assert!(!t(json!({})).agent_vault_allowed("V2"));
        // Even a token that would later fail (no sub, wrong aud, no scopes) is gated.
        let bad = t(json!({"sub": null, "aud": "x", "scopes": [], "vault_ids": ["a"]}));
        assert!(!bad.agent_vault_allowed("default"));
        assert!(!t(json!({"vault_ids": "default"})).agent_vault_allowed("default"));
        assert!(!t(json!({"vault_ids": [1]})).agent_vault_allowed("1"));
        // Other kinds are never gated.
        let h = bearer(PRIMARY, session());
        assert!(verify_token(Some(&h), &keys(), NOW)
            .unwrap()
            .agent_vault_allowed("any"));
        // An expired agent token is not verified, so the gate never sees it.
        let h = bearer(PRIMARY, agent(json!({"exp": NOW})));
        assert_eq!(
            verify_token(Some(&h), &keys(), NOW).err(),
            Some(AuthError::Expired)
        );
    }

    #[test]
    fn s1_authorization_header_must_be_single_text() {
        let mut h = HeaderMap::new();
        assert_eq!(authorization(&h), Ok(None));
        h.insert("authorization", "Bearer x".parse().unwrap());
        assert_eq!(authorization(&h), Ok(Some("Bearer x")));
        h.append("authorization", "Bearer y".parse().unwrap());
        assert_eq!(authorization(&h), Err(AuthError::NotBearer));
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            http::HeaderValue::from_bytes(b"Bearer \xff").unwrap(),
        );
        assert_eq!(authorization(&h), Err(AuthError::NotBearer));
    }

    #[test]
    fn s1_vault_header_trimmed_defaulted_and_validated() {
        let vault = |v: Option<&[u8]>| {
            let mut h = HeaderMap::new();
            if let Some(v) = v {
                h.insert("x-vault-id", http::HeaderValue::from_bytes(v).unwrap());
            }
            requested_vault(&h)
        };
        assert_eq!(vault(None), Ok("default".into()));
        assert_eq!(vault(Some(b"")), Ok("default".into()));
        assert_eq!(vault(Some(b"   ")), Ok("default".into()));
        assert_eq!(vault(Some(b" vault-rest\t")), Ok("vault-rest".into()));
        assert_eq!(vault(Some(b"\xff")), Err(VaultError));
        let mut h = HeaderMap::new();
        h.append("x-vault-id", "a".parse().unwrap());
        h.append("x-vault-id", "b".parse().unwrap());
        assert_eq!(requested_vault(&h), Err(VaultError));

        for ok in ["default", "a", "A-z_0-9", &"v".repeat(64)] {
            assert_eq!(validate_vault(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "a b",
            "a/b",
            "a.b",
            "a%2f",
            "é",
            &"v".repeat(65),
            "a, b",
        ] {
            assert_eq!(validate_vault(bad), Err(VaultError), "{bad}");
        }
    }

    #[test]
    fn identity_debug_never_prints_the_user() {
        let id = get(&bearer(PRIMARY, session())).unwrap();
        assert!(!format!("{id:?}").contains("google:1"));
    }
}
