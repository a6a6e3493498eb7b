//! Tokens whose signature already passed, remembered per key set.
//!
//! A caller sends the same token on every request. Decoding it and recomputing its HMAC
//! each time is most of what authentication costs, so a key set remembers the claims of
//! tokens it verified, as Envoy's `jwt_authn` does. The verdict cannot differ from a
//! fresh verification:
//! - only the signature check and the decoding are remembered; both depend on the token
//!   and the secrets alone, and the time claims are checked again on every request;
//! - the cache belongs to one [`super::Keys`]: a reload builds new keys, so a removed
//!   secret is never honoured from memory;
//! - entries are keyed by the token's SHA-256, so a lookup compares digests, never an
//!   attacker's bytes against a stored token;
//! - only tokens that passed in full are stored: an unauthenticated caller can neither
//!   fill nor probe it.
//!
//! Memory is bounded by `capacity` entries of tokens up to [`MAX_CACHED_TOKEN_BYTES`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Longer tokens are verified on every request and never stored, so each entry's
/// decoded claims stay small.
pub const MAX_CACHED_TOKEN_BYTES: usize = 4096;

/// When the cache is full, entries older than this make room; if none is, the new token
/// is verified but not stored.
pub const ENTRY_LIFETIME: Duration = Duration::from_secs(60);

/// Decoded claims, shared between the cache and the requests that use them.
pub type Claims = Arc<Map<String, Value>>;

type Digest32 = [u8; 32];

/// The remembered verifications of one key set. No `Debug`: the claims name callers.
pub struct Verified {
    capacity: usize,
    entries: Mutex<HashMap<Digest32, (Claims, Instant)>>,
}

impl Verified {
    /// A cache of at most `capacity` tokens; `0` remembers none.
    pub fn new(capacity: usize) -> Verified {
        Verified {
            capacity,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The key a token is stored under, or `None` when it is not to be remembered.
    pub fn key(&self, token: &str) -> Option<Digest32> {
        (self.capacity > 0 && token.len() <= MAX_CACHED_TOKEN_BYTES)
            .then(|| Sha256::digest(token.as_bytes()).into())
    }

    /// The claims of a token verified earlier under this key set.
    pub fn get(&self, key: &Digest32) -> Option<Claims> {
        self.lock().get(key).map(|(claims, _)| Arc::clone(claims))
    }

    /// Remembers a token that passed every check, making room from expired entries.
    pub fn insert(&self, key: Digest32, claims: Claims) {
        self.insert_at(key, claims, Instant::now());
    }

    fn insert_at(&self, key: Digest32, claims: Claims, now: Instant) {
        let mut entries = self.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (_, stored)| now.duration_since(*stored) < ENTRY_LIFETIME);
            if entries.len() >= self.capacity {
                return;
            }
        }
        entries.insert(key, (claims, now));
    }

    /// How many tokens are remembered.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    // A panic while the lock was held cannot leave a half-written map entry, so a
    // poisoned lock is still usable.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Digest32, (Claims, Instant)>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn claims(sub: &str) -> Claims {
        let mut m = Map::new();
        m.insert("sub".into(), Value::String(sub.into()));
        Arc::new(m)
    }

    #[test]
    fn stores_up_to_capacity_then_verifies_without_storing() {
        let v = Verified::new(2);
        for t in ["a", "b", "c"] {
            v.insert(v.key(t).unwrap(), claims(t));
        }
        assert_eq!(v.len(), 2);
        assert!(v.get(&v.key("c").unwrap()).is_none());
        assert_eq!(v.get(&v.key("a").unwrap()).unwrap()["sub"], "a");
        // Storing a known token again replaces it rather than needing room.
        v.insert(v.key("a").unwrap(), claims("a2"));
        assert_eq!(v.get(&v.key("a").unwrap()).unwrap()["sub"], "a2");
    }

    #[test]
    fn a_full_cache_makes_room_from_expired_entries_only() {
        let v = Verified::new(1);
        let t0 = Instant::now();
        v.insert_at(v.key("a").unwrap(), claims("a"), t0);
        v.insert_at(v.key("b").unwrap(), claims("b"), t0 + ENTRY_LIFETIME / 2);
        assert!(v.get(&v.key("b").unwrap()).is_none());
        v.insert_at(v.key("b").unwrap(), claims("b"), t0 + ENTRY_LIFETIME);
        assert!(v.get(&v.key("a").unwrap()).is_none());
        assert_eq!(v.get(&v.key("b").unwrap()).unwrap()["sub"], "b");
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn zero_capacity_and_long_tokens_are_not_stored() {
        assert!(Verified::new(0).key("a").is_none());
        let v = Verified::new(8);
        assert!(v.key(&"x".repeat(MAX_CACHED_TOKEN_BYTES + 1)).is_none());
        assert!(v.key(&"x".repeat(MAX_CACHED_TOKEN_BYTES)).is_some());
    }

    #[test]
    fn keys_are_digests_of_the_whole_token() {
        let v = Verified::new(8);
        assert_ne!(v.key("a.b.c"), v.key("a.b.d"));
        assert_eq!(v.key("a.b.c"), v.key("a.b.c"));
    }
}
