//! Admission bounds: how many client connections may be open, how many intercepted
//! requests may be answered and how many requests may be at the gateway at once. Both refuse at once instead of queueing, so an
//! overload costs the sidecar nothing but the refusal.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A counting bound that refuses when full: one counter, taken with a compare-and-swap
/// and given back with a subtraction (nothing waits for it, so no wait queue and no lock).
#[derive(Debug, Clone)]
pub struct Bound {
    used: Arc<AtomicUsize>,
    max: usize,
}

/// One admitted unit (a connection or a request); released on drop.
#[derive(Debug)]
pub struct Admitted {
    used: Arc<AtomicUsize>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.used.fetch_sub(1, Ordering::Release);
    }
}

impl Bound {
    /// A bound of `max` (at least 1).
    pub fn new(max: usize) -> Bound {
        Bound {
            used: Arc::new(AtomicUsize::new(0)),
            max: max.max(1),
        }
    }

    /// Admits one more, or `None` when `max` are already admitted.
    pub fn try_admit(&self) -> Option<Admitted> {
        self.used
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Admitted {
                used: Arc::clone(&self.used),
            })
    }

    /// How many are admitted now.
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// The bound.
    pub fn max(&self) -> usize {
        self.max
    }
}

/// Open client connections (`listen.max_connections`): over it, a new connection is
/// accepted and closed at once.
pub type ConnectionLimit = Bound;

/// Intercepted requests being answered (`listen.max_in_flight`): over it, 503.
pub type InFlightLimit = Bound;

/// Requests at the gateway without a verified token, each holding an upstream connection
/// until its answer ends (`listen.max_forwarded_in_flight_anonymous`): over it, 503. The
/// identified callers' bound, per user too, is [`crate::budget::Forwarded`].
pub type ForwardedLimit = Bound;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_when_full_and_frees_on_drop() {
        let b = Bound::new(2);
        let a1 = b.try_admit();
        let a2 = b.try_admit();
        assert!(a1.is_some() && a2.is_some());
        assert!(b.try_admit().is_none());
        assert_eq!(b.in_use(), 2);
        drop(a1);
        assert_eq!(b.in_use(), 1);
        assert!(b.try_admit().is_some());
    }

    #[test]
    fn threads_together_never_pass_the_bound() {
        let b = Bound::new(3);
        let peak = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (b, peak) = (b.clone(), Arc::clone(&peak));
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if let Some(a) = b.try_admit() {
                            peak.fetch_max(b.in_use(), Ordering::Relaxed);
                            drop(a);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().ok();
        }
        assert!(peak.load(Ordering::Relaxed) <= 3);
        assert_eq!(b.in_use(), 0, "every unit was given back");
    }

    #[test]
    fn zero_is_raised_to_one() {
        let b = Bound::new(0);
        assert_eq!(b.max(), 1);
        let _a = b.try_admit();
        assert!(b.try_admit().is_none());
    }
}
