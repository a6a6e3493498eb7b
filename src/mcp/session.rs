//! The sidecar's MCP session table (wire contract §6): sessions learned from the
//! `initialize` exchanges the sidecar passes through, kept in step with the gateway's own
//! table, so that a session is alive at both or at neither.
//!
//! Every time in the table is the time a session last *reached the gateway* (its
//! `initialize`, a forwarded `POST`, a `GET`), never the time of a call the sidecar
//! answered itself: the gateway never sees those, so they keep nothing alive there. On
//! that clock the table applies the gateway's own rules: a session idle longer than the
//! lifetime is gone (checked on every lookup; the owner's are swept when the owner opens
//! a session, everyone's when the table is full); a user holds at most the per-user cap,
//! and the session a new `initialize` pushes out is the owner's least recently active at
//! the gateway ([`Sessions::make_room`], applied as the `initialize` leaves, as the
//! gateway applies it when the `initialize` arrives). The table holds at most the global
//! cap (the least recently active overall is evicted, a scan that runs only when the
//! table is full). A session the gateway reports it no longer knows is forgotten, with
//! every session of the same owner last seen at the gateway no later than it
//! ([`Sessions::dropped`]): the gateway's cap and lifetime drop a user's sessions oldest
//! first, and a restart drops them all. Session ids longer than [`MAX_SESSION_ID_BYTES`]
//! or not visible ASCII are never recorded.
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

/// Gateway activity is written to the store at most this often per session.
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
    /// When the session last reached the gateway, as the gateway's own `lastActive`
    /// counts: the idle lifetime and every eviction run on this.
    at_gateway: Instant,
    /// The gateway activity last written to the store.
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
        now.saturating_duration_since(e.at_gateway) > self.ttl
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

    /// The least recently active at the gateway of `ids`.
    fn oldest<'a>(&self, ids: impl Iterator<Item = &'a String>) -> Option<String> {
        ids.filter_map(|id| self.map.get(id).map(|e| (id, e.at_gateway)))
            .min_by_key(|(_, t)| *t)
            .map(|(id, _)| id.clone())
    }

    /// The session ids `owner` holds (a copy: the caller removes some).
    fn owned(&self, owner: &str) -> Vec<String> {
        self.by_owner.get(owner).cloned().unwrap_or_default()
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
    /// still live, at most `max`, each owner's most recently active at the gateway
    /// within `per_user`, as the gateway's cap would have kept them).
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
            let at = monotonic(r.at_gateway, now);
            inner
                .by_owner
                .entry(r.session.owner.clone())
                .or_default()
                .push(r.id.clone());
            inner.map.insert(
                r.id,
                Entry {
                    session: r.session,
                    at_gateway: at,
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

    /// The gateway's rule for a user about to open a session: the owner's expired
    /// sessions go, then, while the owner holds the per-user cap, the least recently
    /// active at the gateway. Called as an `initialize` that opens a session leaves for
    /// the gateway, which applies the same rule when it arrives.
    pub fn make_room(&self, owner: &str, now: Instant) -> Vec<Eviction> {
        let mut inner = self.lock();
        let mut evicted = Vec::new();
        self.make_room_locked(&mut inner, owner, now, &mut evicted);
        evicted
    }

    fn make_room_locked(
        &self,
        inner: &mut Inner,
        owner: &str,
        now: Instant,
        evicted: &mut Vec<Eviction>,
    ) {
        let bounds = inner.bounds;
        for old in inner.owned(owner) {
            if inner.map.get(&old).is_some_and(|e| bounds.expired(e, now)) {
                self.drop_entry(inner, &old);
                evicted.push(Eviction::Idle);
            }
        }
        loop {
            let owned = inner.owned(owner);
            if owned.len() < bounds.per_user {
                break;
            }
            let Some(old) = inner.oldest(owned.iter()) else {
                break;
            };
            self.drop_entry(inner, &old);
            evicted.push(Eviction::UserCap);
        }
    }

    /// Records a session the gateway opened at `now`; returns the evictions it caused.
    /// The owner's room is made as in [`Sessions::make_room`] (nothing is left to do
    /// when that ran as the `initialize` left, unless another `initialize` of the same
    /// owner crossed it); when the table is full, every expired session goes, then the
    /// least recently active.
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
        self.make_room_locked(&mut inner, &session.owner, now, &mut evicted);
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
                at_gateway: now,
                written: now,
            },
        );
        Inserted { evicted, durable }
    }

    /// The live session `id` when `sub` owns it. Looking changes nothing: a call the
    /// sidecar answers itself never reaches the gateway, so it keeps nothing alive. An
    /// expired session is removed (reported as `Err(Eviction::Idle)` so it can be
    /// counted); a foreign or unknown one is `Ok(None)`, indistinguishable to the caller.
    pub fn lookup(&self, id: &str, sub: &str, now: Instant) -> Result<Option<Session>, Eviction> {
        let mut inner = self.lock();
        let expired = match inner.map.get(id) {
            None => return Ok(None),
            Some(e) => inner.bounds.expired(e, now),
        };
        if expired {
            self.drop_entry(&mut inner, id);
            return Err(Eviction::Idle);
        }
        Ok(inner
            .map
            .get(id)
            .filter(|e| e.session.owner == sub)
            .map(|e| e.session.clone()))
    }

    /// A call of `sub` on `id` that left for the gateway at `at` was answered by it in
    /// that session: the gateway marked it active when the call arrived.
    pub fn reached(&self, id: &str, sub: &str, at: Instant) {
        let mut inner = self.lock();
        let Some(entry) = inner.map.get_mut(id).filter(|e| e.session.owner == sub) else {
            return;
        };
        // Calls answered out of order never move the time back.
        if at <= entry.at_gateway {
            return;
        }
        entry.at_gateway = at;
        if let Some(store) = &self.store {
            if at.saturating_duration_since(entry.written) >= TOUCH_WRITE_EVERY {
                entry.written = at;
                store.touch(id, &entry.session, wall(at));
            }
        }
    }

    /// The gateway answered a call of `sub` on `id` as it answers a session it does not
    /// know: `id` is forgotten, and so is every other session of `sub` last seen at the
    /// gateway no later than it (the gateway drops a user's sessions oldest first, by
    /// its cap or its idle lifetime, and all of them when it restarts). Returns how
    /// many were forgotten.
    pub fn dropped(&self, id: &str, sub: &str) -> usize {
        let mut inner = self.lock();
        let Some(last) = inner
            .map
            .get(id)
            .filter(|e| e.session.owner == sub)
            .map(|e| e.at_gateway)
        else {
            return 0;
        };
        let mut n = 0;
        for other in inner.owned(sub) {
            if inner.map.get(&other).is_some_and(|e| e.at_gateway <= last)
                && self.drop_entry(&mut inner, &other).is_some()
            {
                n += 1;
            }
        }
        n
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

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn s6_per_user_cap_evicts_the_least_recently_active_at_the_gateway() {
        let t = Sessions::new(secs(60), 2, 100);
        let now = Instant::now();
        t.insert("a", s("u"), now);
        t.insert("b", s("u"), now + secs(1));
        // `a` reaches the gateway again, so `b` is now the least recently active there.
        t.reached("a", "u", now + secs(2));
        // Calls the sidecar answers itself change nothing: the gateway never sees them.
        assert!(t.lookup("b", "u", now + secs(3)).unwrap().is_some());
        let ev = t.insert("c", s("u"), now + secs(4)).evicted;
        assert_eq!(ev, vec![Eviction::UserCap]);
        assert!(t.lookup("b", "u", now + secs(5)).unwrap().is_none());
        assert!(t.lookup("a", "u", now + secs(5)).unwrap().is_some());
        // Another user's sessions are not counted against `u`.
        t.insert("d", s("v"), now + secs(6));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn s6_local_calls_keep_nothing_alive() {
        let t = Sessions::new(secs(60), 2, 100);
        let now = Instant::now();
        t.insert("a", s("u"), now);
        t.insert("b", s("u"), now + secs(1));
        // `a` is used for the sidecar's own tool only; the gateway last saw it first.
        for i in 2..10 {
            assert!(t.lookup("a", "u", now + secs(i)).unwrap().is_some());
        }
        assert_eq!(t.make_room("u", now + secs(10)), vec![Eviction::UserCap]);
        assert!(t.lookup("a", "u", now + secs(10)).unwrap().is_none());
        assert!(t.lookup("b", "u", now + secs(10)).unwrap().is_some());
        // Nor do they stretch the idle lifetime: `b` expires a minute after the gateway
        // last saw it, however often it was looked at.
        assert_eq!(
            t.lookup("b", "u", now + secs(62)).err(),
            Some(Eviction::Idle)
        );
        // An answer that arrives late never moves the time back.
        t.insert("c", s("u"), now + secs(70));
        t.reached("c", "u", now + secs(100));
        t.reached("c", "u", now + secs(80));
        assert!(t.lookup("c", "u", now + secs(155)).unwrap().is_some());
        // A foreign caller's answer is not the owner's activity.
        t.reached("c", "other", now + secs(200));
        assert_eq!(
            t.lookup("c", "u", now + secs(161)).err(),
            Some(Eviction::Idle)
        );
    }

    #[test]
    fn s6_make_room_is_the_gateways_rule_before_an_initialize() {
        let t = Sessions::new(secs(60), 3, 100);
        let now = Instant::now();
        assert!(t.make_room("u", now).is_empty());
        t.insert("a", s("u"), now);
        t.insert("b", s("u"), now + secs(1));
        t.insert("c", s("u"), now + secs(2));
        t.reached("a", "u", now + secs(3));
        // At the cap: exactly one goes, the least recently active at the gateway.
        assert_eq!(t.make_room("u", now + secs(4)), vec![Eviction::UserCap]);
        assert!(t.lookup("b", "u", now + secs(4)).unwrap().is_none());
        assert_eq!(t.len(), 2);
        // Below the cap nothing goes; the insert that follows needs no room either.
        assert!(t.make_room("u", now + secs(5)).is_empty());
        assert!(t.insert("d", s("u"), now + secs(5)).evicted.is_empty());
        // Expired sessions go first, and then nothing live needs to.
        assert_eq!(t.make_room("u", now + secs(63)), vec![Eviction::Idle]);
        assert!(t.lookup("c", "u", now + secs(63)).unwrap().is_none());
        assert!(t.lookup("a", "u", now + secs(63)).unwrap().is_some());
    }

    #[test]
    fn s6_a_session_the_gateway_dropped_takes_the_owners_older_ones_along() {
        let t = Sessions::new(secs(600), 8, 100);
        let now = Instant::now();
        t.insert("old", s("u"), now);
        t.insert("mid", s("u"), now + secs(1));
        t.insert("new", s("u"), now + secs(2));
        t.insert("other", s("v"), now);
        // A foreign caller cannot make the sidecar forget anything.
        assert_eq!(t.dropped("mid", "v"), 0);
        assert_eq!(t.dropped("mid", "u"), 2);
        assert!(t.lookup("old", "u", now + secs(3)).unwrap().is_none());
        assert!(t.lookup("mid", "u", now + secs(3)).unwrap().is_none());
        assert!(t.lookup("new", "u", now + secs(3)).unwrap().is_some());
        assert!(t.lookup("other", "v", now + secs(3)).unwrap().is_some());
        assert_eq!(t.dropped("mid", "u"), 0);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn s6_idle_sessions_expire_and_foreign_ones_are_invisible() {
        let t = Sessions::new(secs(10), 8, 100);
        let now = Instant::now();
        t.insert("a", s("u"), now);
        assert!(t.lookup("a", "other", now).unwrap().is_none());
        assert!(!t.remove("a", "other"));
        assert_eq!(
            t.lookup("a", "u", now + secs(11)).err(),
            Some(Eviction::Idle)
        );
        assert!(t.is_empty());
    }

    #[test]
    fn s6_expired_sessions_make_room_before_live_ones_are_evicted() {
        let t = Sessions::new(secs(10), 2, 3);
        let now = Instant::now();
        t.insert("a", s("u"), now);
        t.insert("b", s("u"), now + secs(8));
        // `a` has expired: it goes, not `b`.
        let ev = t.insert("c", s("u"), now + secs(12)).evicted;
        assert_eq!(ev, vec![Eviction::Idle]);
        t.reached("b", "u", now + secs(13));
        t.insert("d", s("v"), now + secs(14));
        // Full: `b` and `c` are still live, so the least recently active overall goes.
        let ev = t.insert("e", s("w"), now + secs(15)).evicted;
        assert_eq!(ev, vec![Eviction::GlobalCap]);
        assert!(t.lookup("c", "u", now + secs(15)).unwrap().is_none());
        // Removing by the owner keeps the index consistent for the cap.
        assert!(t.remove("b", "u"));
        assert!(t.insert("f", s("u"), now + secs(16)).evicted.is_empty());
        assert_eq!(
            t.insert("g", s("u"), now + secs(17)).evicted,
            vec![Eviction::GlobalCap]
        );
        // `u` holds `f` and `g` now: its own oldest makes room, the table is not full.
        assert_eq!(
            t.insert("h", s("u"), now + secs(18)).evicted,
            vec![Eviction::UserCap]
        );
        assert!(t.lookup("f", "u", now + secs(19)).unwrap().is_none());
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn s6_global_cap_and_bad_ids() {
        let t = Sessions::new(secs(60), 8, 2);
        let now = Instant::now();
        t.insert("a", s("u"), now);
        t.insert("b", s("v"), now + secs(1));
        let ev = t.insert("c", s("w"), now + secs(2)).evicted;
        assert_eq!(ev, vec![Eviction::GlobalCap]);
        assert_eq!(t.len(), 2);
        assert!(t.insert("bad id", s("u"), now).evicted.is_empty());
        assert!(t.insert(&"x".repeat(300), s("u"), now).evicted.is_empty());
        assert_eq!(t.len(), 2);
    }
}
