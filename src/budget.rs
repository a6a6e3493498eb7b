//! Admission of authenticated work that holds something scarce: a slot among the
//! requests being answered (`listen.max_in_flight`, and `listen.max_in_flight_per_user`
//! for one `sub`) and bytes of buffered request bodies (`listen.max_buffered_bytes`, and
//! `listen.max_buffered_bytes_per_user`). Everything refuses at once instead of
//! queueing; the caller answers 503 with `Retry-After`.
//!
//! Nothing here is taken before a token has been verified (wire contract §6 door): an
//! unauthenticated caller costs a header parse and an HMAC, never a slot or a buffer.
//! The per-user table only holds users with a slot or bytes in use, so it is bounded by
//! `listen.max_in_flight`. Users are keyed by a keyed 64-bit SipHash of `sub` (random per
//! process): the table's memory does not depend on how long a `sub` is, and two users
//! colliding would only share a budget.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus::IntGauge;

use crate::limits::{Admitted, InFlightLimit};
use crate::worker::Padded;

/// Why work was refused; every reason is answered 503 with `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `listen.max_in_flight` requests are being answered.
    InFlight,
    /// This user has `listen.max_in_flight_per_user` requests being answered.
    UserInFlight,
    /// `listen.max_buffered_bytes` are buffered.
    Buffered,
    /// This user has `listen.max_buffered_bytes_per_user` buffered.
    UserBuffered,
    /// `listen.max_forwarded_in_flight` requests of identified callers are at the gateway.
    Forwarded,
    /// `listen.max_forwarded_in_flight_anonymous` requests without a verified token are at
    /// the gateway.
    AnonymousForwarded,
    /// This user has `listen.max_forwarded_in_flight_per_user` requests at the gateway.
    UserForwarded,
    /// Identified callers hold `listen.max_event_streams` event streams.
    EventStreams,
}

impl Refusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::InFlight => "in_flight",
            Refusal::UserInFlight => "user_in_flight",
            Refusal::Buffered => "buffered_bytes",
            Refusal::UserBuffered => "user_buffered_bytes",
            Refusal::Forwarded => "forwarded_in_flight",
            Refusal::AnonymousForwarded => "anonymous_forwarded_in_flight",
            Refusal::UserForwarded => "user_forwarded_in_flight",
            Refusal::EventStreams => "event_streams",
        }
    }

    /// Every label, for pre-registering metric series.
    pub const ALL: [Refusal; 8] = [
        Refusal::InFlight,
        Refusal::UserInFlight,
        Refusal::Buffered,
        Refusal::UserBuffered,
        Refusal::Forwarded,
        Refusal::AnonymousForwarded,
        Refusal::UserForwarded,
        Refusal::EventStreams,
    ];
}

/// The limits, as configured.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Requests being answered over all users.
    pub max_in_flight: usize,
    /// Requests being answered for one user.
    pub max_in_flight_per_user: usize,
    /// Buffered body bytes over all users.
    pub max_bytes: usize,
    /// Buffered body bytes for one user.
    pub max_bytes_per_user: usize,
}

#[derive(Debug, Default)]
struct Usage {
    slots: usize,
    bytes: usize,
}

/// Shards of the per-user table: a user's entry lives in one, picked by its key, so a
/// per-user bound stays exact while two workers admitting different users take
/// different locks.
const SHARDS: usize = 32;

/// One shard of the per-user table, by key.
type Users = HashMap<u64, Usage>;

#[derive(Debug)]
struct Inner {
    limits: Limits,
    hasher: RandomState,
    users: Box<[Padded<Mutex<Users>>]>,
    /// Buffered bytes over all users, taken with a compare-and-swap against the bound.
    bytes: AtomicUsize,
    /// Follows `bytes` by the same additions and subtractions.
    gauge: Option<IntGauge>,
}

impl Inner {
    fn lock(&self, key: u64) -> MutexGuard<'_, Users> {
        // The high bits: the table's own hashing uses the low ones.
        let shard = (key >> 58) as usize % SHARDS;
        // Every update leaves the table consistent, so a poisoned lock is still usable.
        self.users[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives back `slots` and `bytes` of `key`, dropping the user when nothing is left.
    fn release(&self, key: u64, slots: usize, bytes: usize) {
        if bytes > 0 {
            self.bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.show(-signed(bytes));
        }
        let mut users = self.lock(key);
        if let Some(u) = users.get_mut(&key) {
            u.slots = u.slots.saturating_sub(slots);
            u.bytes = u.bytes.saturating_sub(bytes);
            if u.slots == 0 && u.bytes == 0 {
                users.remove(&key);
            }
        }
    }

    /// Takes `n` bytes of the overall bound, or refuses.
    fn take_bytes(&self, n: usize) -> Result<(), Refusal> {
        let max = self.limits.max_bytes;
        self.bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                b.checked_add(n).filter(|total| *total <= max)
            })
            .map(|_| self.show(signed(n)))
            .map_err(|_| Refusal::Buffered)
    }

    fn show(&self, delta: i64) {
        if let Some(g) = &self.gauge {
            g.add(delta);
        }
    }
}

fn signed(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The shared budget.
#[derive(Debug, Clone)]
pub struct Budget {
    slots: InFlightLimit,
    inner: Arc<Inner>,
}

impl Budget {
    /// A budget with `limits` (each at least 1); `gauge`, when given, always shows the
    /// buffered bytes.
    pub fn new(limits: Limits, gauge: Option<IntGauge>) -> Budget {
        let limits = Limits {
            max_in_flight: limits.max_in_flight.max(1),
            max_in_flight_per_user: limits.max_in_flight_per_user.max(1),
            max_bytes: limits.max_bytes.max(1),
            max_bytes_per_user: limits.max_bytes_per_user.max(1),
        };
        Budget {
            slots: InFlightLimit::new(limits.max_in_flight),
            inner: Arc::new(Inner {
                limits,
                hasher: RandomState::new(),
                users: (0..SHARDS).map(|_| Padded::default()).collect(),
                bytes: AtomicUsize::new(0),
                gauge,
            }),
        }
    }

    /// Takes a slot for one request of `sub`.
    pub fn admit(&self, sub: &str) -> Result<Slot, Refusal> {
        let key = self.inner.hasher.hash_one(sub);
        let permit = self.slots.try_admit().ok_or(Refusal::InFlight)?;
        let mut users = self.inner.lock(key);
        let usage = users.entry(key).or_default();
        if usage.slots >= self.inner.limits.max_in_flight_per_user {
            if usage.bytes == 0 && usage.slots == 0 {
                users.remove(&key);
            }
            return Err(Refusal::UserInFlight);
        }
        usage.slots += 1;
        Ok(Slot {
            inner: Arc::clone(&self.inner),
            key,
            _permit: permit,
            bytes: Reservation {
                inner: Arc::clone(&self.inner),
                key,
                bytes: 0,
            },
        })
    }

    /// An empty reservation of `sub`'s bytes, taking no slot: for what an answer that
    /// lasts (an event stream read as it passes) holds now and then.
    pub fn reservation(&self, sub: &str) -> Reservation {
        Reservation {
            inner: Arc::clone(&self.inner),
            key: self.inner.hasher.hash_one(sub),
            bytes: 0,
        }
    }

    /// Requests being answered now.
    pub fn in_flight(&self) -> usize {
        self.slots.in_use()
    }

    /// Body bytes buffered now.
    pub fn buffered_bytes(&self) -> usize {
        self.inner.bytes.load(Ordering::Acquire)
    }

    /// Users with a slot or bytes in use.
    pub fn tracked_users(&self) -> usize {
        self.inner
            .users
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

/// Charges `slot` for a canister note of `body` and for each parse of it, as
/// [`crate::extract::parse_note_charged`] asks; the total charged (to give back with
/// [`Slot::unreserve`]) and the first refusal, if any.
pub fn charge_note<'a>(
    slot: &'a mut Slot,
    charged: &'a mut usize,
    refusal: &'a mut Option<Charge>,
) -> impl FnMut(usize) -> bool + 'a {
    move |n| match slot.charge(n) {
        Ok(()) => {
            *charged += n;
            true
        }
        Err(c) => {
            refusal.get_or_insert(c);
            false
        }
    }
}

/// Why [`Slot::charge`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// More than the caller's share could ever hold.
    TooLarge,
    /// No room now.
    Refused(Refusal),
}

/// Requests of identified callers at the gateway: `listen.max_forwarded_in_flight` over
/// all users and `listen.max_forwarded_in_flight_per_user` for one `sub`, so that one
/// token cannot take every caller's room. The same per-user slot table as the requests
/// being answered (bounded by the overall bound), with no bytes.
#[derive(Debug, Clone)]
pub struct Forwarded(Budget);

impl Forwarded {
    /// A bound of `max` requests, `per_user` for one user (each at least 1).
    pub fn new(max: usize, per_user: usize) -> Forwarded {
        Forwarded(Budget::new(
            Limits {
                max_in_flight: max,
                max_in_flight_per_user: per_user,
                max_bytes: 1,
                max_bytes_per_user: 1,
            },
            None,
        ))
    }

    /// Takes a place for one request of `sub`, held until the slot drops.
    pub fn admit(&self, sub: &str) -> Result<Slot, Refusal> {
        self.0.admit(sub).map_err(|r| match r {
            Refusal::UserInFlight => Refusal::UserForwarded,
            _ => Refusal::Forwarded,
        })
    }

    /// Requests at the gateway now.
    pub fn in_flight(&self) -> usize {
        self.0.in_flight()
    }

    /// Users with a request at the gateway.
    pub fn tracked_users(&self) -> usize {
        self.0.tracked_users()
    }
}

/// One admitted request: its slot, and the body bytes it has reserved. Dropping it gives
/// both back; [`Slot::into_reservation`] gives the slot back and keeps the bytes.
#[derive(Debug)]
pub struct Slot {
    inner: Arc<Inner>,
    key: u64,
    _permit: Admitted,
    bytes: Reservation,
}

impl Slot {
    /// Reserves `n` more body bytes for this request.
    pub fn reserve(&mut self, n: usize) -> Result<(), Refusal> {
        self.bytes.reserve(n)
    }

    /// Bytes reserved so far.
    pub fn reserved(&self) -> usize {
        self.bytes.bytes
    }

    /// Gives back `n` of the bytes reserved (at most all of them).
    pub fn unreserve(&mut self, n: usize) {
        let n = n.min(self.bytes.bytes);
        if n > 0 {
            self.bytes.bytes -= n;
            self.inner.release(self.key, 0, n);
        }
    }

    /// Reserves `n` more bytes of memory this request holds (a parse, a note), to give
    /// back with [`Slot::unreserve`]: [`Charge::TooLarge`] when the request could never
    /// hold that much (more than the smaller of the per-user and the global bounds),
    /// [`Charge::Refused`] when there is no room now.
    pub fn charge(&mut self, n: usize) -> Result<(), Charge> {
        let most = self
            .inner
            .limits
            .max_bytes_per_user
            .min(self.inner.limits.max_bytes);
        if self.reserved().saturating_add(n) > most {
            return Err(Charge::TooLarge);
        }
        self.reserve(n).map_err(Charge::Refused)
    }

    /// Frees the slot (the request no longer counts as being answered) and keeps the
    /// bytes reserved until the returned reservation drops: a body forwarded upstream
    /// stays in memory until the gateway has read it.
    pub fn into_reservation(mut self) -> Reservation {
        let kept = std::mem::take(&mut self.bytes.bytes);
        Reservation {
            inner: Arc::clone(&self.inner),
            key: self.key,
            bytes: kept,
        }
        // `self` drops here: its slot is given back, its emptied reservation frees nothing.
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.inner.release(self.key, 1, 0);
    }
}

/// Body bytes held for one request; given back on drop.
#[derive(Debug)]
pub struct Reservation {
    inner: Arc<Inner>,
    key: u64,
    bytes: usize,
}

impl Reservation {
    /// Gives back every byte held now; the reservation can reserve again.
    pub fn release(&mut self) {
        let n = std::mem::take(&mut self.bytes);
        if n > 0 {
            self.inner.release(self.key, 0, n);
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Reserves `n` more bytes, held until this reservation drops.
    pub fn reserve(&mut self, n: usize) -> Result<(), Refusal> {
        // The overall bound first (its refusal wins, as it always has), then the user's;
        // a user refused gives the overall bytes straight back.
        self.inner.take_bytes(n)?;
        let mut users = self.inner.lock(self.key);
        let usage = users.entry(self.key).or_default();
        if usage.bytes.saturating_add(n) > self.inner.limits.max_bytes_per_user {
            if usage.bytes == 0 && usage.slots == 0 {
                users.remove(&self.key);
            }
            drop(users);
            self.inner.bytes.fetch_sub(n, Ordering::AcqRel);
            self.inner.show(-signed(n));
            return Err(Refusal::UserBuffered);
        }
        usage.bytes += n;
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.inner.release(self.key, 0, self.bytes);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn budget() -> Budget {
        Budget::new(
            Limits {
                max_in_flight: 4,
                max_in_flight_per_user: 2,
                max_bytes: 100,
                max_bytes_per_user: 60,
            },
            None,
        )
    }

    #[test]
    fn places_at_the_gateway_are_bounded_per_user_and_overall() {
        let f = Forwarded::new(3, 2);
        let a1 = f.admit("a").unwrap();
        let _a2 = f.admit("a").unwrap();
        assert_eq!(f.admit("a").unwrap_err(), Refusal::UserForwarded);
        let _b1 = f.admit("b").unwrap();
        assert_eq!(f.admit("c").unwrap_err(), Refusal::Forwarded);
        assert_eq!((f.in_flight(), f.tracked_users()), (3, 2));
        drop(a1);
        assert!(f.admit("c").is_ok());
    }

    #[test]
    fn slots_are_bounded_per_user_and_overall() {
        let b = budget();
        let a1 = b.admit("a").unwrap();
        let _a2 = b.admit("a").unwrap();
        assert_eq!(b.admit("a").unwrap_err(), Refusal::UserInFlight);
        let _b1 = b.admit("b").unwrap();
        let _c1 = b.admit("c").unwrap();
        assert_eq!(b.admit("d").unwrap_err(), Refusal::InFlight);
        drop(a1);
        assert!(b.admit("a").is_ok());
        assert_eq!(b.in_flight(), 3);
    }

    #[test]
    fn bytes_are_bounded_per_user_and_overall() {
        let b = budget();
        let mut a = b.admit("a").unwrap();
        a.reserve(50).unwrap();
        assert_eq!(a.reserve(11).unwrap_err(), Refusal::UserBuffered);
        let mut c = b.admit("c").unwrap();
        c.reserve(40).unwrap();
        assert_eq!(c.reserve(11).unwrap_err(), Refusal::Buffered);
        assert_eq!(b.buffered_bytes(), 90);
        drop(a);
        assert_eq!(b.buffered_bytes(), 40);
        c.reserve(11).unwrap();
    }

    #[test]
    fn a_reservation_outlives_its_slot_and_the_table_empties() {
        let b = budget();
        let mut a = b.admit("a").unwrap();
        a.reserve(30).unwrap();
        let kept = a.into_reservation();
        assert_eq!(b.in_flight(), 0);
        assert_eq!(b.buffered_bytes(), 30);
        assert_eq!(b.tracked_users(), 1);
        drop(kept);
        assert_eq!(b.buffered_bytes(), 0);
        assert_eq!(b.tracked_users(), 0);
    }

    #[test]
    fn the_gauge_follows_every_change() {
        let gauge = IntGauge::new("buffered", "test").unwrap();
        let b = Budget::new(
            Limits {
                max_in_flight: 4,
                max_in_flight_per_user: 2,
                max_bytes: 100,
                max_bytes_per_user: 60,
            },
            Some(gauge.clone()),
        );
        let mut a = b.admit("a").unwrap();
        a.reserve(30).unwrap();
        assert_eq!(gauge.get(), 30);
        drop(a);
        assert_eq!(gauge.get(), 0);
    }

    #[test]
    fn threads_together_keep_every_bound_exact() {
        let b = Budget::new(
            Limits {
                max_in_flight: 6,
                max_in_flight_per_user: 2,
                max_bytes: 1000,
                max_bytes_per_user: 300,
            },
            None,
        );
        let peak = Arc::new(std::sync::Mutex::new((0usize, 0usize)));
        std::thread::scope(|s| {
            for t in 0..4 {
                let (b, peak) = (b.clone(), Arc::clone(&peak));
                s.spawn(move || {
                    for i in 0..5_000 {
                        let user = if i % 2 == 0 {
                            "shared"
                        } else {
                            ["a", "b", "c", "d"][t]
                        };
                        if let Ok(mut slot) = b.admit(user) {
                            let _ = slot.reserve(120);
                            let mut p = peak.lock().unwrap();
                            p.0 = p.0.max(b.in_flight());
                            p.1 = p.1.max(b.buffered_bytes());
                        }
                    }
                });
            }
        });
        let (slots, bytes) = *peak.lock().unwrap();
        assert!(slots <= 6 && bytes <= 1000, "{slots} slots, {bytes} bytes");
        assert_eq!(
            (b.in_flight(), b.buffered_bytes(), b.tracked_users()),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_user_refused_gives_the_overall_bytes_back() {
        let b = budget();
        let mut a = b.admit("a").unwrap();
        a.reserve(60).unwrap();
        assert_eq!(a.reserve(1).unwrap_err(), Refusal::UserBuffered);
        assert_eq!(b.buffered_bytes(), 60);
        let mut c = b.admit("c").unwrap();
        c.reserve(40).unwrap();
        assert_eq!(b.buffered_bytes(), 100);
    }
}
