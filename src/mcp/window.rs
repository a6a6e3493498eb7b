//! The 60-per-minute request window per caller (§6 step 3), bounded in callers.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The rate window (§6 step 3).
const WINDOW: Duration = Duration::from_secs(60);

/// A sliding 60 s request log per `sub` (§6 step 3), bounded in users.
pub(super) struct Window {
    limit: usize,
    max_keys: usize,
    map: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl Window {
    /// At most `limit` requests a minute per caller, for at most `max_keys` callers.
    pub(super) fn new(limit: usize, max_keys: usize) -> Window {
        Window {
            limit,
            max_keys,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one request of `sub`; `false` when the window is full (nothing counted).
    pub(super) fn hit(&self, sub: &str, now: Instant) -> bool {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let fresh = |q: &mut VecDeque<Instant>| {
            while q
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) >= WINDOW)
            {
                q.pop_front();
            }
        };
        if !map.contains_key(sub) && map.len() >= self.max_keys {
            map.retain(|_, q| {
                fresh(q);
                !q.is_empty()
            });
            if map.len() >= self.max_keys {
                // Full of active users: refuse rather than grow without bound.
                return false;
            }
        }
        let q = map.entry(sub.to_owned()).or_default();
        fresh(q);
        if q.len() >= self.limit {
            return false;
        }
        q.push_back(now);
        true
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
}
