//! Caller tokens (wire contract §1): HMAC JWTs signed with a test secret.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

/// Signs `claims` with HS256.
///
/// # Panics
/// If signing fails, which only a broken crypto backend could cause; use
/// [`try_sign_token`] to handle that.
pub fn sign_token(secret: &str, claims: serde_json::Value) -> String {
    sign_token_alg(Algorithm::HS256, secret, claims)
}

/// Signs `claims` with `alg` (HS256, HS384 or HS512; the gateway accepts all three).
///
/// # Panics
/// If `alg` is not an HMAC algorithm or signing fails.
pub fn sign_token_alg(alg: Algorithm, secret: &str, claims: serde_json::Value) -> String {
    match encode(
        &Header::new(alg),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    ) {
        Ok(token) => token,
        Err(e) => panic!("signing a test token failed: {e}"),
    }
}

/// Signs `claims` with HS256.
pub fn try_sign_token(
    secret: &str,
    claims: &serde_json::Value,
) -> Result<String, jsonwebtoken::errors::Error> {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Claims of a Hub login token for `sub`: `type` `session`, `iat` now, `exp` after `ttl`.
pub fn session_claims(sub: &str, ttl: Duration) -> serde_json::Value {
    let now = unix_now();
    serde_json::json!({
        "sub": sub,
        "type": "session",
        "iat": now,
        "exp": now.saturating_add(ttl.as_secs()),
    })
}
