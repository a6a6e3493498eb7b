//! Admission bounds: how many client connections may be open, how many intercepted
//! requests may be answered and how many requests may be at the gateway at once. Both refuse at once instead of queueing, so an
//! overload costs the sidecar nothing but the refusal.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A counting bound that refuses when full.
#[derive(Debug, Clone)]
pub struct Bound {
    permits: Arc<Semaphore>,
    max: usize,
}

/// One admitted unit (a connection or a request); released on drop.
#[derive(Debug)]
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
}

impl Bound {
    /// A bound of `max` (at least 1).
    pub fn new(max: usize) -> Bound {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Bound {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// Admits one more, or `None` when `max` are already admitted.
    pub fn try_admit(&self) -> Option<Admitted> {
        Arc::clone(&self.permits)
            .try_acquire_owned()
            .ok()
            .map(|p| Admitted { _permit: p })
    }

    /// How many are admitted now.
    pub fn in_use(&self) -> usize {
        self.max - self.permits.available_permits()
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
    fn zero_is_raised_to_one() {
        let b = Bound::new(0);
        assert_eq!(b.max(), 1);
        let _a = b.try_admit();
        assert!(b.try_admit().is_none());
    }
}
