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
//! Memory is bounded by `capacity` entries whose decoded claims hold at most
//! [`MAX_CACHED_CLAIMS_BYTES`] of heap (an upper estimate, [`claims_heap_bytes`]), plus
//! under 256 bytes each for the shared allocation around the claims and the map slot
//! (digest, pointer, time) at the table's lowest load. A token's length alone does not
//! bound it: a 4 KiB token whose payload is an array of zeros decodes to about 50 KiB.
//!
//! The entries are split into shards by digest, each under its own lock, with their
//! number over all shards one atomic: workers verifying different tokens take different
//! locks, and `capacity` bounds them all together.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Longer tokens are verified on every request and never stored, so each entry's
/// decoded claims stay small.
pub const MAX_CACHED_TOKEN_BYTES: usize = 4096;

/// Claims estimated to hold more heap than this are verified on every request and never
/// stored. Ordinary tokens stay well under it; an agent token naming 64 vaults comes
/// to about 5.5 KiB.
pub const MAX_CACHED_CLAIMS_BYTES: usize = 8192;

/// When the cache is full, entries older than this make room; if none is, the new token
/// is verified but not stored.
pub const ENTRY_LIFETIME: Duration = Duration::from_secs(60);

/// Decoded claims, shared between the cache and the requests that use them.
pub type Claims = Arc<Map<String, Value>>;

type Digest32 = [u8; 32];

/// One shard of the entries: a token's claims and when they were stored, by digest.
type Entries = HashMap<Digest32, (Claims, Instant)>;

/// Shards of the entries.
const SHARDS: usize = 16;

/// The remembered verifications of one key set. No `Debug`: the claims name callers.
pub struct Verified {
    capacity: usize,
    shards: Box<[crate::worker::Padded<Mutex<Entries>>]>,
    /// Entries over every shard, at most `capacity`.
    stored: AtomicUsize,
}

impl Verified {
    /// A cache of at most `capacity` tokens; `0` remembers none.
    pub fn new(capacity: usize) -> Verified {
        Verified {
            capacity,
            shards: (0..SHARDS)
                .map(|_| crate::worker::Padded::default())
                .collect(),
            stored: AtomicUsize::new(0),
        }
    }

    /// The key a token is stored under, or `None` when it is not to be remembered.
    pub fn key(&self, token: &str) -> Option<Digest32> {
        (self.capacity > 0 && token.len() <= MAX_CACHED_TOKEN_BYTES)
            .then(|| Sha256::digest(token.as_bytes()).into())
    }

    /// The claims of a token verified earlier under this key set.
    pub fn get(&self, key: &Digest32) -> Option<Claims> {
        self.lock(key)
            .get(key)
            .map(|(claims, _)| Arc::clone(claims))
    }

    /// Remembers a token that passed every check, making room from expired entries.
    pub fn insert(&self, key: Digest32, claims: Claims) {
        self.insert_at(key, claims, Instant::now());
    }

    fn insert_at(&self, key: Digest32, claims: Claims, now: Instant) {
        if claims_heap_bytes(&claims, MAX_CACHED_CLAIMS_BYTES) > MAX_CACHED_CLAIMS_BYTES {
            return;
        }
        let mut entries = self.lock(&key);
        if !entries.contains_key(&key) && !self.take_room() {
            // Full: drop the expired entries of every shard (one lock at a time, never
            // two held), then try once more.
            drop(entries);
            for shard in self.shards.iter() {
                let mut other = shard.lock().unwrap_or_else(PoisonError::into_inner);
                let before = other.len();
                other.retain(|_, (_, stored)| now.duration_since(*stored) < ENTRY_LIFETIME);
                self.stored
                    .fetch_sub(before - other.len(), Ordering::AcqRel);
            }
            entries = self.lock(&key);
            if !entries.contains_key(&key) && !self.take_room() {
                return;
            }
        }
        entries.insert(key, (claims, now));
    }

    /// Counts one more entry, unless `capacity` are stored.
    fn take_room(&self) -> bool {
        self.stored
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .is_ok()
    }

    /// How many tokens are remembered.
    pub fn len(&self) -> usize {
        self.stored.load(Ordering::Acquire)
    }

    /// The shard of `key`. A panic while the lock was held cannot leave a half-written
    /// map entry, so a poisoned lock is still usable.
    fn lock(&self, key: &Digest32) -> MutexGuard<'_, Entries> {
        // A digest's bytes are uniform: the first picks the shard.
        self.shards[usize::from(key[0]) % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// An upper estimate of the heap `claims` holds, counted until it passes `limit` (the
/// result is then some value over `limit`). Each allocation is rounded up to a power of
/// two, which no allocator size class exceeds; a non-empty object is charged one B-tree
/// node per five entries and one more, since nodes of 11 slots stay at least five full.
pub fn claims_heap_bytes(claims: &Map<String, Value>, limit: usize) -> usize {
    let mut total = 0;
    let mut pending: Vec<&Value> = Vec::new();
    total += object_bytes(claims, &mut pending);
    while let Some(value) = pending.pop() {
        if total > limit {
            break;
        }
        total += match value {
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
            Value::String(s) => allocation(s.capacity()),
            Value::Array(items) => {
                pending.extend(items);
                allocation(items.capacity() * size_of::<Value>())
            }
            Value::Object(map) => object_bytes(map, &mut pending),
        };
    }
    total
}

/// An object's nodes and keys; its values are left on `pending`.
fn object_bytes<'a>(map: &'a Map<String, Value>, pending: &mut Vec<&'a Value>) -> usize {
    if map.is_empty() {
        return 0;
    }
    // A B-tree node: 11 keys, 11 values, 12 child pointers and a little bookkeeping.
    const NODE: usize = 11 * (size_of::<String>() + size_of::<Value>()) + 12 * 8 + 16;
    let mut total = (map.len() / 5 + 1) * allocation(NODE);
    for (key, value) in map {
        total += allocation(key.capacity());
        pending.push(value);
    }
    total
}

/// The most an allocation of `bytes` can take: the next power of two, at least 16.
fn allocation(bytes: usize) -> usize {
    if bytes == 0 {
        0
    } else {
        bytes.next_power_of_two().max(16)
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

    fn parse(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn ordinary_claims_are_stored() {
        let session = parse(r#"{"sub":"user-123","type":"session","iat":1,"exp":2}"#);
        let vaults: Vec<String> = (0..64).map(|i| format!("vault-{i:04}")).collect();
        let agent = serde_json::json!({
            "sub": "agent:builder", "type": "agent_access", "aud": "knowtation-hub",
            "typ": "agent", "scopes": ["vault:read", "vault:write", "vault:admin", "admin"],
            "vault_ids": vaults, "iat": 1, "exp": 2, "jti": "0123456789abcdef",
        });
        let Value::Object(agent) = agent else {
            panic!("an object")
        };
        for claims in [session, agent] {
            let bytes = claims_heap_bytes(&claims, usize::MAX);
            assert!(bytes <= MAX_CACHED_CLAIMS_BYTES, "{bytes}");
            let v = Verified::new(4);
            v.insert(v.key("t").unwrap(), Arc::new(claims));
            assert_eq!(v.len(), 1);
        }
    }

    #[test]
    fn claims_of_exactly_the_cap_are_stored() {
        // Six fields: two B-tree nodes (2 × 1,024), six short keys (6 × 16) and strings
        // whose allocations add up to the rest, 8,192 bytes in all: at the cap, not over.
        let lengths = [32, 128, 256, 512, 1024, 4096];
        let mut claims = Map::new();
        for (key, len) in ["sub", "a", "b", "c", "d", "e"].into_iter().zip(lengths) {
            claims.insert(key.to_owned(), Value::String("x".repeat(len)));
        }
        assert_eq!(
            claims_heap_bytes(&claims, usize::MAX),
            MAX_CACHED_CLAIMS_BYTES
        );
        let v = Verified::new(4);
        v.insert(v.key("t").unwrap(), Arc::new(claims));
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn claims_that_reach_the_cap_with_more_to_come_are_not_stored() {
        // Seven fields: the nodes and keys (2,048 + 7 × 16) and the six values read first
        // reach exactly 8,192 bytes; the value read last ("a": the stack pops the first
        // key last) takes it over, so the estimate must not stop at the cap itself.
        let mut claims = Map::new();
        claims.insert("a".to_owned(), Value::String("x".repeat(16)));
        for (key, len) in ["b", "c", "d", "e", "f", "g"]
            .into_iter()
            .zip([16, 128, 256, 512, 1024, 4096])
        {
            claims.insert(key.to_owned(), Value::String("x".repeat(len)));
        }
        assert_eq!(
            claims_heap_bytes(&claims, usize::MAX),
            MAX_CACHED_CLAIMS_BYTES + 16
        );
        assert!(claims_heap_bytes(&claims, MAX_CACHED_CLAIMS_BYTES) > MAX_CACHED_CLAIMS_BYTES);
        let v = Verified::new(4);
        v.insert(v.key("t").unwrap(), Arc::new(claims));
        assert_eq!(v.len(), 0);
    }

    /// `{"sub":"u","x":[item,item,…]}`.
    fn array_of(item: &str, n: usize) -> String {
        format!(r#"{{"sub":"u","x":[{}]}}"#, vec![item; n].join(","))
    }

    #[test]
    fn claims_that_decode_large_are_verified_but_never_stored() {
        // Each fits a token of at most 4 KiB, yet decodes to tens of KiB.
        let keys: Vec<String> = (0..400).map(|i| format!(r#""{i}":0"#)).collect();
        for json in [
            array_of("0", 1500),
            array_of(r#""""#, 1000),
            array_of("{}", 1000),
            array_of("[]", 1000),
            format!("{{{}}}", keys.join(",")),
        ] {
            let claims = parse(&json);
            assert!(claims_heap_bytes(&claims, usize::MAX) > MAX_CACHED_CLAIMS_BYTES);
            let v = Verified::new(4);
            v.insert(v.key("t").unwrap(), Arc::new(claims));
            assert_eq!(v.len(), 0, "{}", &json[..20]);
        }
        // Deep nesting is walked without recursion; 40 arrays of one element (room for
        // four, as the parser allocates them) come to 5 KiB.
        let nested = format!(r#"{{"x":{}0{}}}"#, "[".repeat(40), "]".repeat(40));
        assert!(claims_heap_bytes(&parse(&nested), usize::MAX) <= MAX_CACHED_CLAIMS_BYTES);
    }

    #[test]
    fn the_estimate_stops_soon_after_the_limit() {
        let claims = parse(&array_of("0", 1500));
        let all = claims_heap_bytes(&claims, usize::MAX);
        let stopped = claims_heap_bytes(&claims, 64);
        assert!(stopped > 64 && stopped <= all);
    }

    #[test]
    fn keys_are_digests_of_the_whole_token() {
        let v = Verified::new(8);
        // The SHA-256 of the token's bytes (`printf a.b.c | sha256sum`).
        let hex = "845e30448809e2bc8958eb025bfc795235d13b077a53d0c3abbd2385170dc9b8";
        let want: Vec<u8> = (0..32)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect();
        assert_eq!(v.key("a.b.c").map(|k| k.to_vec()), Some(want));
        // A token that differs anywhere, or is longer or shorter, has another key.
        for other in [
            "b.b.c", "A.b.c", "a.c.c", "a.b.C", "a.b.d", "a.b.c.", ".a.b.c", "a.b.",
        ] {
            assert_ne!(v.key("a.b.c"), v.key(other), "{other}");
        }
    }

    #[test]
    fn the_capacity_bounds_every_shard_together() {
        let v = Verified::new(5);
        let t0 = Instant::now();
        for i in 0..100 {
            let name = format!("token-{i}");
            v.insert_at(v.key(&name).unwrap(), claims(&name), t0);
        }
        assert_eq!(v.len(), 5);
        let stored = (0..100)
            .filter(|i| v.get(&v.key(&format!("token-{i}")).unwrap()).is_some())
            .count();
        assert_eq!(stored, 5);
        // Once they have expired, a new token makes room in whichever shard held them.
        v.insert_at(v.key("late").unwrap(), claims("late"), t0 + ENTRY_LIFETIME);
        assert_eq!(v.len(), 1);
        assert!(v.get(&v.key("late").unwrap()).is_some());
    }
}
