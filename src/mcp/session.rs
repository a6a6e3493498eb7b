//! The sidecar's MCP session table (wire contract §6): sessions learned from the
//! `initialize` exchanges the sidecar passes through, with the gateway's bounds.
//!
//! Bounds: a session idle longer than the lifetime is gone (checked on every lookup and
//! swept on every insert); a user holds at most the per-user cap (the least recently
//! active is evicted, as the gateway does); the table holds at most the global cap (the
//! least recently active overall is evicted). Session ids longer than
//! [`MAX_SESSION_ID_BYTES`] or not visible ASCII are never recorded.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use http::HeaderValue;

use crate::telemetry::Eviction;

/// Longest `mcp-session-id` recorded (the SDK issues UUIDs).
pub const MAX_SESSION_ID_BYTES: usize = 256;

/// What the sidecar remembers about one session: frozen at `initialize` (§4, §6).
#[derive(Clone)]
pub struct Session {
    /// The owner: the `sub` of the `initialize` request's token.
    pub owner: String,
    /// The vault of the `initialize` request (§1).
    pub vault: String,
    /// The `initialize` request's `Authorization` header, verbatim.
    pub authorization: HeaderValue,
    /// The effective canister user from the sidecar's own lookup (§2).
    pub effective_user: String,
    /// The role from the same lookup (§2).
    pub role: String,
}

impl fmt::Debug for Session {
    // Never print user ids, vaults or tokens.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session").finish_non_exhaustive()
    }
}

struct Entry {
    session: Session,
    last_active: Instant,
}

/// The bounded table; see the module doc.
pub struct Sessions {
    ttl: Duration,
    per_user: usize,
    max: usize,
    map: Mutex<HashMap<String, Entry>>,
}

impl fmt::Debug for Sessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sessions")
            .field("ttl", &self.ttl)
            .field("per_user", &self.per_user)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

/// Whether `id` may be recorded as a session id.
pub fn valid_session_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_SESSION_ID_BYTES && id.bytes().all(|b| b.is_ascii_graphic())
}

impl Sessions {
    /// An empty table with the idle lifetime `ttl`, `per_user` and `max` caps (each at
    /// least 1).
    pub fn new(ttl: Duration, per_user: usize, max: usize) -> Sessions {
        Sessions {
            ttl,
            per_user: per_user.max(1),
            max: max.max(1),
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // Every update leaves the map consistent; a panicking holder breaks nothing.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a session; returns the evictions it caused.
    pub fn insert(&self, id: &str, session: Session, now: Instant) -> Vec<Eviction> {
        let mut evicted = Vec::new();
        if !valid_session_id(id) {
            return evicted;
        }
        let mut map = self.lock();
        let ttl = self.ttl;
        let before = map.len();
        map.retain(|_, e| now.saturating_duration_since(e.last_active) <= ttl);
        evicted.extend(std::iter::repeat_n(Eviction::Idle, before - map.len()));
        map.remove(id);
        loop {
            let owned = map
                .iter()
                .filter(|(_, e)| e.session.owner == session.owner)
                .count();
            if owned < self.per_user {
                break;
            }
            if !remove_oldest(&mut map, Some(&session.owner)) {
                break;
            }
            evicted.push(Eviction::UserCap);
        }
        while map.len() >= self.max {
            if !remove_oldest(&mut map, None) {
                break;
            }
            evicted.push(Eviction::GlobalCap);
        }
        map.insert(
            id.to_owned(),
            Entry {
                session,
                last_active: now,
            },
        );
        evicted
    }

    /// The live session `id` when `sub` owns it, marking it active. An expired session is
    /// removed (reported as `Err(Eviction::Idle)` so it can be counted); a foreign or
    /// unknown one is `Ok(None)`, indistinguishable to the caller.
    pub fn touch(&self, id: &str, sub: &str, now: Instant) -> Result<Option<Session>, Eviction> {
        let mut map = self.lock();
        let Some(entry) = map.get_mut(id) else {
            return Ok(None);
        };
        if now.saturating_duration_since(entry.last_active) > self.ttl {
            map.remove(id);
            return Err(Eviction::Idle);
        }
        if entry.session.owner != sub {
            return Ok(None);
        }
        entry.last_active = now;
        Ok(Some(entry.session.clone()))
    }

    /// Forgets `id` when `sub` owns it (a `DELETE`); returns whether it did.
    pub fn remove(&self, id: &str, sub: &str) -> bool {
        let mut map = self.lock();
        if map.get(id).is_some_and(|e| e.session.owner == sub) {
            map.remove(id);
            return true;
        }
        false
    }

    /// How many sessions are held (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Removes the least recently active entry (of `owner`, when given).
fn remove_oldest(map: &mut HashMap<String, Entry>, owner: Option<&str>) -> bool {
    let oldest = map
        .iter()
        .filter(|(_, e)| owner.is_none_or(|o| e.session.owner == o))
        .min_by_key(|(_, e)| e.last_active)
        .map(|(k, _)| k.clone());
    match oldest {
        Some(k) => map.remove(&k).is_some(),
        None => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn s(owner: &str) -> Session {
        Session {
            owner: owner.to_owned(),
            vault: "default".to_owned(),
            authorization: HeaderValue::from_static("Bearer t"),
            effective_user: owner.to_owned(),
            role: "viewer".to_owned(),
        }
    }

    #[test]
    fn s6_per_user_cap_evicts_the_least_recently_active() {
        let t = Sessions::new(Duration::from_secs(60), 2, 100);
        let now = Instant::now();
        t.insert("a", s("u"), now);
        t.insert("b", s("u"), now + Duration::from_secs(1));
        // `a` is used again, so `b` is now the least recently active.
        assert!(t
            .touch("a", "u", now + Duration::from_secs(2))
            .unwrap()
            .is_some());
        let ev = t.insert("c", s("u"), now + Duration::from_secs(3));
        assert_eq!(ev, vec![Eviction::UserCap]);
        assert!(t
            .touch("b", "u", now + Duration::from_secs(4))
            .unwrap()
            .is_none());
        assert!(t
            .touch("a", "u", now + Duration::from_secs(4))
            .unwrap()
            .is_some());
        // Another user's sessions are not counted against `u`.
        t.insert("d", s("v"), now + Duration::from_secs(5));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn s6_idle_sessions_expire_and_foreign_ones_are_invisible() {
        let t = Sessions::new(Duration::from_secs(10), 8, 100);
        let now = Instant::now();
        t.insert("a", s("u"), now);
        assert!(t.touch("a", "other", now).unwrap().is_none());
        assert!(!t.remove("a", "other"));
        assert_eq!(
            t.touch("a", "u", now + Duration::from_secs(11)).err(),
            Some(Eviction::Idle)
        );
        assert!(t.is_empty());
    }

    #[test]
    fn s6_global_cap_and_bad_ids() {
        let t = Sessions::new(Duration::from_secs(60), 8, 2);
        let now = Instant::now();
        t.insert("a", s("u"), now);
        t.insert("b", s("v"), now + Duration::from_secs(1));
        let ev = t.insert("c", s("w"), now + Duration::from_secs(2));
        assert_eq!(ev, vec![Eviction::GlobalCap]);
        assert_eq!(t.len(), 2);
        assert!(t.insert("bad id", s("u"), now).is_empty());
        assert!(t.insert(&"x".repeat(300), s("u"), now).is_empty());
        assert_eq!(t.len(), 2);
    }
}
