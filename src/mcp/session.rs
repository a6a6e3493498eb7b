//! The sidecar's MCP session table (wire contract §6): sessions learned from the
//! `initialize` exchanges the sidecar passes through, with the gateway's bounds.
//!
//! Bounds: a session idle longer than the lifetime is gone (checked on every lookup; the
//! owner's are swept on every insert, everyone's when the table is full); a user holds
//! at most the per-user cap (the least recently active is evicted, as the gateway does);
//! the table holds at most the global cap (the least recently active overall is
//! evicted, a scan that runs only when the table is full). Session ids longer than
//! [`MAX_SESSION_ID_BYTES`] or not visible ASCII are never recorded.
//!
//! The table outlives a configuration reload (the bounds are swapped in place) and, with
//! a [`Store`], a restart: every change is written through to `state.directory`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use http::HeaderValue;
use tokio::sync::oneshot;

use super::store::{Restored, Store};
use crate::telemetry::Eviction;

/// Activity is written to the store at most this often per session.
const TOUCH_WRITE_EVERY: Duration = Duration::from_secs(60);

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
    /// The activity time last written to the store.
    written: Instant,
}

/// The table's bounds, replaced by a reload.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    ttl: Duration,
    per_user: usize,
    max: usize,
}

impl Bounds {
    fn expired(&self, e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.last_active) > self.ttl
    }
}

/// The table and an index of each owner's session ids (at most the per-user cap each),
/// so the per-user rules never scan the whole table.
struct Inner {
    bounds: Bounds,
    map: HashMap<String, Entry>,
    by_owner: HashMap<String, Vec<String>>,
}

impl Inner {
    fn remove(&mut self, id: &str) -> Option<Entry> {
        let entry = self.map.remove(id)?;
        if let Some(ids) = self.by_owner.get_mut(&entry.session.owner) {
            ids.retain(|i| i != id);
            if ids.is_empty() {
                self.by_owner.remove(&entry.session.owner);
            }
        }
        Some(entry)
    }

    /// The least recently active of `ids`.
    fn oldest<'a>(&self, ids: impl Iterator<Item = &'a String>) -> Option<String> {
        ids.filter_map(|id| self.map.get(id).map(|e| (id, e.last_active)))
            .min_by_key(|(_, t)| *t)
            .map(|(id, _)| id.clone())
    }
}

/// The bounded table; see the module doc.
pub struct Sessions {
    inner: Mutex<Inner>,
    store: Option<Store>,
}

impl fmt::Debug for Sessions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sessions")
            .field("bounds", &self.lock().bounds)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// What [`Sessions::insert`] did.
#[derive(Debug)]
pub struct Inserted {
    /// The sessions it evicted to make room.
    pub evicted: Vec<Eviction>,
    /// With a store: resolves to whether the record is on disk.
    pub durable: Option<oneshot::Receiver<bool>>,
}

/// The wall-clock time of `at`.
fn wall(at: Instant) -> SystemTime {
    let (now, wall_now) = (Instant::now(), SystemTime::now());
    if at >= now {
        wall_now + (at - now)
    } else {
        wall_now
            .checked_sub(now - at)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

/// The monotonic time of the wall-clock `at` (never in the future).
fn monotonic(at: SystemTime, now: Instant) -> Instant {
    let ago = SystemTime::now().duration_since(at).unwrap_or_default();
    now.checked_sub(ago).unwrap_or(now)
}

/// Whether `id` may be recorded as a session id.
pub fn valid_session_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_SESSION_ID_BYTES && id.bytes().all(|b| b.is_ascii_graphic())
}

impl Sessions {
    /// An empty table with the idle lifetime `ttl`, `per_user` and `max` caps (each at
    /// least 1), kept in memory only.
    pub fn new(ttl: Duration, per_user: usize, max: usize) -> Sessions {
        Sessions {
            inner: Mutex::new(Inner {
                bounds: Bounds {
                    ttl,
                    per_user: per_user.max(1),
                    max: max.max(1),
                },
                map: HashMap::new(),
                by_owner: HashMap::new(),
            }),
            store: None,
        }
    }

    /// A table written through to `store`, holding the sessions it restored (those
    /// still live, at most `max`, each owner's most recent within `per_user`).
    pub fn persistent(ttl: Duration, per_user: usize, max: usize, store: Store) -> Sessions {
        let mut table = Sessions::new(ttl, per_user, max);
        let restored = store.load(ttl, max.max(1));
        table.store = Some(store);
        table.restore(restored, Instant::now());
        table
    }

    fn restore(&self, restored: Vec<Restored>, now: Instant) {
        let mut inner = self.lock();
        // Most recent first: each owner keeps its newest sessions within the cap.
        for r in restored {
            let owned = inner.by_owner.get(&r.session.owner).map_or(0, Vec::len);
            if owned >= inner.bounds.per_user || inner.map.contains_key(&r.id) {
                if let Some(store) = &self.store {
                    store.remove(&r.id);
                }
                continue;
            }
            let at = monotonic(r.last_active, now);
            inner
                .by_owner
                .entry(r.session.owner.clone())
                .or_default()
                .push(r.id.clone());
            inner.map.insert(
                r.id,
                Entry {
                    session: r.session,
                    last_active: at,
                    written: at,
                },
            );
        }
    }

    /// Applies reloaded bounds (clamped as in [`Sessions::new`]); sessions beyond a lower
    /// cap go at the owner's next `initialize` or when the table is next full.
    pub fn set_bounds(&self, ttl: Duration, per_user: usize, max: usize) {
        self.lock().bounds = Bounds {
            ttl,
            per_user: per_user.max(1),
            max: max.max(1),
        };
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update leaves the table consistent; a panicking holder breaks nothing.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops `id` from the table and the store.
    fn drop_entry(&self, inner: &mut Inner, id: &str) -> Option<Entry> {
        let entry = inner.remove(id)?;
        if let Some(store) = &self.store {
            store.remove(id);
        }
        Some(entry)
    }

    /// Records a session; returns the evictions it caused. Expired sessions of the owner
    /// are dropped first, then the owner's least recently active ones beyond the cap;
    /// when the table is full, every expired session, then the least recently active.
    pub fn insert(&self, id: &str, session: Session, now: Instant) -> Inserted {
        let mut evicted = Vec::new();
        if !valid_session_id(id) {
            return Inserted {
                evicted,
                durable: None,
            };
        }
        let mut inner = self.lock();
        let bounds = inner.bounds;
        self.drop_entry(&mut inner, id);
        let owned: Vec<String> = inner
            .by_owner
            .get(&session.owner)
            .cloned()
            .unwrap_or_default();
        for old in &owned {
            if inner.map.get(old).is_some_and(|e| bounds.expired(e, now)) {
                self.drop_entry(&mut inner, old);
                evicted.push(Eviction::Idle);
            }
        }
        while inner
            .by_owner
            .get(&session.owner)
            .is_some_and(|ids| ids.len() >= bounds.per_user)
        {
            let ids = inner
                .by_owner
                .get(&session.owner)
                .cloned()
                .unwrap_or_default();
            let Some(old) = inner.oldest(ids.iter()) else {
                break;
            };
            self.drop_entry(&mut inner, &old);
            evicted.push(Eviction::UserCap);
        }
        if inner.map.len() >= bounds.max {
            let stale: Vec<String> = inner
                .map
                .iter()
                .filter(|(_, e)| bounds.expired(e, now))
                .map(|(k, _)| k.clone())
                .collect();
            for old in stale {
                self.drop_entry(&mut inner, &old);
                evicted.push(Eviction::Idle);
            }
        }
        while inner.map.len() >= bounds.max {
            let Some(old) = inner.oldest(inner.map.keys()) else {
                break;
            };
            self.drop_entry(&mut inner, &old);
            evicted.push(Eviction::GlobalCap);
        }
        inner
            .by_owner
            .entry(session.owner.clone())
            .or_default()
            .push(id.to_owned());
        let durable = self
            .store
            .as_ref()
            .and_then(|store| store.create(id, &session, wall(now)));
        inner.map.insert(
            id.to_owned(),
            Entry {
                session,
                last_active: now,
                written: now,
            },
        );
        Inserted { evicted, durable }
    }

    /// The live session `id` when `sub` owns it, marking it active. An expired session is
    /// removed (reported as `Err(Eviction::Idle)` so it can be counted); a foreign or
    /// unknown one is `Ok(None)`, indistinguishable to the caller.
    pub fn touch(&self, id: &str, sub: &str, now: Instant) -> Result<Option<Session>, Eviction> {
        let mut inner = self.lock();
        let expired = match inner.map.get(id) {
            None => return Ok(None),
            Some(e) => inner.bounds.expired(e, now),
        };
        if expired {
            self.drop_entry(&mut inner, id);
            return Err(Eviction::Idle);
        }
        let Some(entry) = inner.map.get_mut(id) else {
            return Ok(None);
        };
        if entry.session.owner != sub {
            return Ok(None);
        }
        entry.last_active = now;
        if let Some(store) = &self.store {
            if now.saturating_duration_since(entry.written) >= TOUCH_WRITE_EVERY {
                entry.written = now;
                store.touch(id, &entry.session, wall(now));
            }
        }
        Ok(Some(entry.session.clone()))
    }

    /// Forgets `id` when `sub` owns it (a `DELETE`); returns whether it did.
    pub fn remove(&self, id: &str, sub: &str) -> bool {
        let mut inner = self.lock();
        if inner.map.get(id).is_some_and(|e| e.session.owner == sub) {
            return self.drop_entry(&mut inner, id).is_some();
        }
        false
    }

    /// How many sessions are held (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        let ev = t.insert("c", s("u"), now + Duration::from_secs(3)).evicted;
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
    fn s6_expired_sessions_make_room_before_live_ones_are_evicted() {
        let t = Sessions::new(Duration::from_secs(10), 2, 3);
        let now = Instant::now();
        t.insert("a", s("u"), now);
        t.insert("b", s("u"), now + Duration::from_secs(8));
        // `a` has expired: it goes, not `b`.
        let ev = t.insert("c", s("u"), now + Duration::from_secs(12)).evicted;
        assert_eq!(ev, vec![Eviction::Idle]);
        assert!(t
            .touch("b", "u", now + Duration::from_secs(13))
            .unwrap()
            .is_some());
        t.insert("d", s("v"), now + Duration::from_secs(14));
        // Full: `b` and `c` are still live, so the least recently active overall goes.
        let ev = t.insert("e", s("w"), now + Duration::from_secs(15)).evicted;
        assert_eq!(ev, vec![Eviction::GlobalCap]);
        assert!(t
            .touch("c", "u", now + Duration::from_secs(15))
            .unwrap()
            .is_none());
        // Removing by the owner keeps the index consistent for the cap.
        assert!(t.remove("b", "u"));
        assert!(t
            .insert("f", s("u"), now + Duration::from_secs(16))
            .evicted
            .is_empty());
        assert_eq!(
            t.insert("g", s("u"), now + Duration::from_secs(17)).evicted,
            vec![Eviction::GlobalCap]
        );
        // `u` holds `f` and `g` now: its own oldest makes room, the table is not full.
        assert_eq!(
            t.insert("h", s("u"), now + Duration::from_secs(18)).evicted,
            vec![Eviction::UserCap]
        );
        assert!(t
            .touch("f", "u", now + Duration::from_secs(19))
            .unwrap()
            .is_none());
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn s6_global_cap_and_bad_ids() {
        let t = Sessions::new(Duration::from_secs(60), 8, 2);
        let now = Instant::now();
        t.insert("a", s("u"), now);
        t.insert("b", s("v"), now + Duration::from_secs(1));
        let ev = t.insert("c", s("w"), now + Duration::from_secs(2)).evicted;
        assert_eq!(ev, vec![Eviction::GlobalCap]);
        assert_eq!(t.len(), 2);
        assert!(t.insert("bad id", s("u"), now).evicted.is_empty());
        assert!(t.insert(&"x".repeat(300), s("u"), now).evicted.is_empty());
        assert_eq!(t.len(), 2);
    }
}
