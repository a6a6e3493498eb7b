//! Rate limits for intercepted requests (wire contract §5 Deviation): a GCRA budget per
//! `sub` (governor) and an optional global one.
//!
//! The per-user table is bounded by `rate_limit.max_keys`. Governor's own keyed store
//! can forget idle keys (`retain_recent`) but cannot tell whether a key is already
//! tracked, so it cannot refuse only *new* keys when full; the table here is therefore a
//! map of governor direct limiters with the same forgetting rule: a key idle for the
//! time its burst takes to refill is indistinguishable from a fresh one and is dropped.
//!
//! When the table is full of keys active within that window, new keys are **refused**
//! (429) rather than evicting someone's state: evicting would hand a fresh burst to
//! whoever pushed it out, and filling the table already takes `max_keys` distinct
//! authenticated users active within one refill window (6 s by default). Tracked users
//! keep their own budgets meanwhile.
//!
//! Keys are a keyed 64-bit SipHash of `sub` (random per process), so the table's memory
//! does not depend on how long a `sub` is; two users colliding would only share a budget.
//!
//! The table is split into shards by key, each under its own lock, with the number of
//! keys over all of them one atomic: workers checking different users take different
//! locks, and a user's budget, in one shard, stays exact whichever worker serves it.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use crate::config;
use crate::worker::Padded;

/// Idle keys are swept at least this often.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// Shards of the per-user table.
const SHARDS: usize = 16;

/// A refused request and how long to wait before retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    /// Time until a retry can succeed.
    pub retry_after: Duration,
}

impl Limited {
    /// `Retry-After` in whole seconds, rounded up, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        let whole = self.retry_after.as_secs();
        let secs = if self.retry_after.subsec_nanos() > 0 {
            whole.saturating_add(1)
        } else {
            whole
        };
        secs.max(1)
    }
}

/// The limiter for one surface.
pub struct RateLimit {
    per_user: Option<PerUser>,
    global: Option<DefaultDirectRateLimiter>,
    clock: DefaultClock,
}

impl fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("per_user", &self.per_user.is_some())
            .field("global", &self.global.is_some())
            .finish()
    }
}

struct PerUser {
    quota: Quota,
    max_keys: usize,
    /// A key idle this long holds a full burst again.
    idle_after: Duration,
    hasher: RandomState,
    shards: Box<[Padded<Mutex<Table>>]>,
    /// Keys over every shard, at most `max_keys`.
    keys: AtomicUsize,
}

struct Table {
    slots: HashMap<u64, Slot>,
    last_sweep: Instant,
}

struct Slot {
    limiter: DefaultDirectRateLimiter,
    last_seen: Instant,
}

impl RateLimit {
    /// Builds the limits from `rate_limit`: `per_user_per_minute` with `burst` (0 is
    /// treated as 1) per `sub`, `global_per_second` over everyone; 0 disables either.
    pub fn new(cfg: &config::RateLimit) -> RateLimit {
        let clock = DefaultClock::default();
        let per_user = NonZeroU32::new(cfg.per_user_per_minute).map(|rate| {
            let burst = NonZeroU32::new(cfg.burst).unwrap_or(NonZeroU32::MIN);
            let quota = Quota::per_minute(rate).allow_burst(burst);
            PerUser {
                quota,
                max_keys: cfg.max_keys.max(1),
                idle_after: quota.burst_size_replenished_in(),
                hasher: RandomState::new(),
                shards: (0..SHARDS)
                    .map(|_| {
                        Padded(Mutex::new(Table {
                            slots: HashMap::new(),
                            last_sweep: Instant::now(),
                        }))
                    })
                    .collect(),
                keys: AtomicUsize::new(0),
            }
        });
        let global = NonZeroU32::new(cfg.global_per_second)
            .map(|rate| RateLimiter::direct_with_clock(Quota::per_second(rate), clock.clone()));
        RateLimit {
            per_user,
            global,
            clock,
        }
    }

    /// Takes one request from `sub`'s budget, then from the global one.
    pub fn check(&self, sub: &str) -> Result<(), Limited> {
        if let Some(p) = &self.per_user {
            p.check(sub, &self.clock)?;
        }
        if let Some(g) = &self.global {
            g.check().map_err(|n| Limited {
                retry_after: n.wait_time_from(self.clock.now()),
            })?;
        }
        Ok(())
    }

    /// How many users are tracked.
    pub fn tracked_users(&self) -> usize {
        self.per_user
            .as_ref()
            .map_or(0, |p| p.keys.load(Ordering::Acquire))
    }
}

impl PerUser {
    fn lock(&self, shard: usize) -> MutexGuard<'_, Table> {
        // Every update leaves the table consistent, so a poisoned lock is still usable.
        self.shards[shard % SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one more key, unless `max_keys` are tracked.
    fn take_key(&self) -> bool {
        self.keys
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    fn check(&self, sub: &str, clock: &DefaultClock) -> Result<(), Limited> {
        let key = self.hasher.hash_one(sub);
        // The high bits: the shard's own map hashes with the low ones.
        let shard = (key >> 60) as usize;
        let now = Instant::now();
        let mut table = self.lock(shard);
        if now.saturating_duration_since(table.last_sweep) >= SWEEP_INTERVAL {
            self.sweep(&mut table, now);
        }
        if !table.slots.contains_key(&key) && !self.take_key() {
            // Full: forget the idle keys of every shard (one lock at a time), then try
            // once more.
            drop(table);
            let mut oldest = now;
            for i in 0..SHARDS {
                let mut other = self.lock(i);
                self.sweep(&mut other, now);
                if let Some(seen) = other.slots.values().map(|s| s.last_seen).min() {
                    oldest = oldest.min(seen);
                }
            }
            table = self.lock(shard);
            if !table.slots.contains_key(&key) && !self.take_key() {
                // Full of active users: refuse the newcomer until the oldest goes idle.
                let idle_at = oldest + self.idle_after;
                return Err(Limited {
                    retry_after: idle_at.saturating_duration_since(now),
                });
            }
        }
        let slot = table.slots.entry(key).or_insert_with(|| Slot {
            limiter: RateLimiter::direct_with_clock(self.quota, clock.clone()),
            last_seen: now,
        });
        slot.last_seen = now;
        slot.limiter.check().map_err(|n| Limited {
            retry_after: n.wait_time_from(clock.now()),
        })
    }

    /// Forgets keys idle long enough to hold a full burst again (governor's
    /// `retain_recent` rule).
    fn sweep(&self, table: &mut Table, now: Instant) {
        let idle_after = self.idle_after;
        let before = table.slots.len();
        table
            .slots
            .retain(|_, s| now.saturating_duration_since(s.last_seen) < idle_after);
        self.keys
            .fetch_sub(before - table.slots.len(), Ordering::AcqRel);
        table.last_sweep = now;
        if table.slots.capacity() > 2 * table.slots.len() + 64 {
            table.slots.shrink_to_fit();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn cfg(per_minute: u32, burst: u32, global: u32, max_keys: usize) -> config::RateLimit {
        config::RateLimit {
            per_user_per_minute: per_minute,
            burst,
            global_per_second: global,
            max_keys,
        }
    }

    #[test]
    fn s5_burst_then_refused_with_retry_after() {
        let rl = RateLimit::new(&cfg(60, 3, 0, 10));
        for _ in 0..3 {
            assert!(rl.check("u").is_ok());
        }
        let limited = rl.check("u").unwrap_err();
        // One per second refills: the wait is at most a second, rounded up to 1.
        assert!(limited.retry_after <= Duration::from_secs(1));
        assert_eq!(limited.retry_after_secs(), 1);
        // Other users have their own budget.
        assert!(rl.check("v").is_ok());
    }

    #[test]
    fn s5_retry_after_rounds_up() {
        let l = |ms| Limited {
            retry_after: Duration::from_millis(ms),
        };
        assert_eq!(l(0).retry_after_secs(), 1);
        assert_eq!(l(1).retry_after_secs(), 1);
        assert_eq!(l(1000).retry_after_secs(), 1);
        assert_eq!(l(1001).retry_after_secs(), 2);
        assert_eq!(l(59_500).retry_after_secs(), 60);
    }

    #[test]
    fn s5_zero_disables_and_zero_burst_is_one() {
        let off = RateLimit::new(&cfg(0, 0, 0, 10));
        for _ in 0..1000 {
            assert!(off.check("u").is_ok());
        }
        assert_eq!(off.tracked_users(), 0);
        let one = RateLimit::new(&cfg(1, 0, 0, 10));
        assert!(one.check("u").is_ok());
        let l = one.check("u").unwrap_err();
        assert!(l.retry_after_secs() > 50 && l.retry_after_secs() <= 60);
    }

    #[test]
    fn s5_global_limit_applies_over_all_users() {
        let rl = RateLimit::new(&cfg(0, 0, 2, 10));
        assert!(rl.check("a").is_ok());
        assert!(rl.check("b").is_ok());
        assert!(rl.check("c").is_err());
    }

    #[test]
    fn s5_full_table_refuses_new_users_but_not_tracked_ones() {
        let rl = RateLimit::new(&cfg(1, 5, 0, 2));
        assert!(rl.check("a").is_ok());
        assert!(rl.check("b").is_ok());
        let refused = rl.check("c").unwrap_err();
        assert!(refused.retry_after_secs() >= 1);
        assert_eq!(rl.tracked_users(), 2);
        assert!(rl.check("a").is_ok());
        assert!(rl.check("b").is_ok());
    }

    #[test]
    fn s5_idle_users_are_forgotten() {
        // 6000/min refills a burst of 1 in 10 ms.
        let rl = RateLimit::new(&cfg(6000, 1, 0, 1));
        assert!(rl.check("a").is_ok());
        std::thread::sleep(Duration::from_millis(30));
        assert!(rl.check("b").is_ok(), "a was idle and made room");
        assert_eq!(rl.tracked_users(), 1);
    }

    #[test]
    fn keys_do_not_grow_with_sub_length() {
        let rl = RateLimit::new(&cfg(60, 1, 0, 4));
        assert!(rl.check(&"x".repeat(100_000)).is_ok());
        assert_eq!(rl.tracked_users(), 1);
    }

    #[test]
    fn users_in_every_shard_count_against_one_bound() {
        let rl = RateLimit::new(&cfg(60, 5, 0, 40));
        let admitted = (0..200)
            .filter(|i| rl.check(&format!("user-{i}")).is_ok())
            .count();
        assert_eq!((admitted, rl.tracked_users()), (40, 40));
        // Every tracked user keeps its own budget, whichever shard holds it.
        assert!(rl.check("user-0").is_ok());
    }

    #[test]
    fn threads_never_pass_a_users_burst() {
        let rl = RateLimit::new(&cfg(1, 50, 0, 1000));
        let ok = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100 {
                        if rl.check("shared").is_ok() {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(ok.load(Ordering::Relaxed), 50);
        assert_eq!(rl.tracked_users(), 1);
    }
}
