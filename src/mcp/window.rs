//! The 60-per-minute request window per caller (§6 step 3), bounded in callers.
//!
//! Callers are keyed by a keyed 64-bit SipHash of `sub` (random per process), as the
//! budget's table is: an entry's size does not depend on how long a `sub` is. Callers
//! with nothing left in their window are swept once a window, so the table holds the
//! callers of the last minute or two, at most `max_keys`.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The rate window (§6 step 3).
const WINDOW: Duration = Duration::from_secs(60);

/// A sliding 60 s request log per `sub` (§6 step 3), bounded in users.
pub(super) struct Window {
    limit: usize,
    max_keys: usize,
    hasher: RandomState,
    table: Mutex<Table>,
}

struct Table {
    callers: HashMap<u64, VecDeque<Instant>>,
    swept: Option<Instant>,
}

/// Drops the requests of `q` older than the window before `now`.
fn fresh(q: &mut VecDeque<Instant>, now: Instant) {
    while q
        .front()
        .is_some_and(|t| now.saturating_duration_since(*t) >= WINDOW)
    {
        q.pop_front();
    }
}

impl Table {
    /// Forgets every caller with nothing left in its window.
    fn sweep(&mut self, now: Instant) {
        self.callers.retain(|_, q| {
            fresh(q, now);
            !q.is_empty()
        });
        self.swept = Some(now);
    }
}

impl Window {
    /// At most `limit` requests a minute per caller, for at most `max_keys` callers.
    pub(super) fn new(limit: usize, max_keys: usize) -> Window {
        Window {
            limit,
            max_keys,
            hasher: RandomState::new(),
            table: Mutex::new(Table {
                callers: HashMap::new(),
                swept: None,
            }),
        }
    }

    /// Counts one request of `sub`; `false` when the window is full (nothing counted).
    pub(super) fn hit(&self, sub: &str, now: Instant) -> bool {
        let key = self.hasher.hash_one(sub);
        let mut t = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let due = t
            .swept
            .is_none_or(|s| now.saturating_duration_since(s) >= WINDOW);
        if due {
            t.sweep(now);
        }
        if !t.callers.contains_key(&key) && t.callers.len() >= self.max_keys {
            t.sweep(now);
            if t.callers.len() >= self.max_keys {
                // Full of active users: refuse rather than grow without bound.
                return false;
            }
        }
        let q = t.callers.entry(key).or_default();
        fresh(q, now);
        if q.len() >= self.limit {
            return false;
        }
        q.push_back(now);
        true
    }

    /// Callers in the table now.
    #[cfg(test)]
    fn callers(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .callers
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s6_window_slides() {
        let w = Window::new(2, 1);
        let t = Instant::now();
        assert!(w.hit("a", t));
        assert!(w.hit("a", t));
        assert!(!w.hit("a", t + Duration::from_secs(59)));
        assert!(w.hit("a", t + Duration::from_secs(60)));
        // The table is full of an active user.
        assert!(!w.hit("b", t + Duration::from_secs(60)));
        assert!(w.hit("b", t + Duration::from_secs(200)));
    }

    #[test]
    fn s6_callers_of_past_windows_are_forgotten_and_long_subs_cost_nothing() {
        let w = Window::new(60, 100);
        let t = Instant::now();
        let long = "s".repeat(40_000);
        for i in 0..50 {
            assert!(w.hit(&format!("{long}{i}"), t));
        }
        assert_eq!(w.callers(), 50);
        // A window later, the next request sweeps the quiet callers away.
        assert!(w.hit("a", t + Duration::from_secs(61)));
        assert_eq!(w.callers(), 1);
    }
}
