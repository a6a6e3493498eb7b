//! The worker model's bottom layer: which worker thread is running, and state kept once
//! per worker so that the request path writes to no memory another worker writes to.
//!
//! The proxy runs `runtime.threads` workers, each a thread with a single-threaded event
//! loop of its own: a connection, its requests and its upstream exchanges stay on the
//! worker that accepted it. Per-worker state ([`PerWorker`]) is indexed by
//! [`current`]; a thread that is no worker (the control thread, a test) counts as
//! worker 0, which is always correct, only not contention-free.

use std::cell::Cell;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// Marks the calling thread as worker `index` for the rest of its life.
pub fn enter(index: usize) {
    INDEX.with(|i| i.set(index));
}

/// The worker the calling thread is (0 for a thread that is no worker).
pub fn current() -> usize {
    INDEX.with(Cell::get)
}

/// The worker threads to run: `configured` (`runtime.threads`), or with 0 one per CPU
/// the process may use. The standard library counts the CPU affinity mask and a cgroup
/// CPU limit, so a container limited to one CPU gets one worker.
pub fn count(configured: usize, available: Option<std::num::NonZeroUsize>) -> usize {
    match configured {
        0 => available.map_or(1, std::num::NonZeroUsize::get),
        n => n,
    }
}

/// `runtime.threads` resolved on this machine (see [`count`]).
pub fn count_here(configured: usize) -> usize {
    count(configured, std::thread::available_parallelism().ok())
}

/// A value aligned to its own cache lines (two, for the adjacent-line prefetcher), so
/// that writes by one worker never invalidate another worker's line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// One `T` per worker, each on cache lines of its own; [`PerWorker::get`] gives the
/// calling worker's.
#[derive(Debug)]
pub struct PerWorker<T> {
    slots: Box<[Padded<T>]>,
}

impl<T> PerWorker<T> {
    /// `n` values (at least one), the `i`th made by `make(i)`.
    pub fn new(n: usize, mut make: impl FnMut(usize) -> T) -> PerWorker<T> {
        PerWorker {
            slots: (0..n.max(1)).map(|i| Padded(make(i))).collect(),
        }
    }

    /// One value per worker, in worker order; `None` when `values` is empty.
    pub fn from_values(values: Vec<T>) -> Option<PerWorker<T>> {
        (!values.is_empty()).then(|| PerWorker {
            slots: values.into_iter().map(Padded).collect(),
        })
    }

    /// The calling worker's value.
    pub fn get(&self) -> &T {
        // A thread numbered past the slots (none is) would share one, never miss one.
        &self.slots[current() % self.slots.len()]
    }

    /// Every worker's value, for summing.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|p| &p.0)
    }

    /// How many values there are.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Never: there is at least one value.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroUsize;

    #[test]
    fn zero_threads_means_one_per_usable_cpu() {
        assert_eq!(count(0, NonZeroUsize::new(6)), 6);
        assert_eq!(count(0, None), 1);
        assert_eq!(count(3, NonZeroUsize::new(6)), 3);
    }

    #[test]
    fn each_worker_gets_its_own_value() {
        let per = PerWorker::new(3, |i| i * 10);
        assert_eq!(per.len(), 3);
        assert_eq!(*per.get(), 0, "a thread that is no worker is worker 0");
        let seen: Vec<usize> = (0..4)
            .map(|w| {
                std::thread::spawn(move || {
                    enter(w);
                    current()
                })
                .join()
                .unwrap_or(usize::MAX)
            })
            .collect();
        assert_eq!(seen, [0, 1, 2, 3]);
        enter(2);
        assert_eq!(*per.get(), 20);
        enter(4);
        assert_eq!(*per.get(), 10, "past the slots, shared, never missing");
        enter(0);
        assert_eq!(per.iter().sum::<usize>(), 30);
    }

    #[test]
    fn padded_values_do_not_share_cache_lines() {
        assert!(std::mem::align_of::<Padded<u64>>() >= 128);
        let per = PerWorker::new(2, |_| 0u64);
        let a = std::ptr::from_ref(&per.slots[0]) as usize;
        let b = std::ptr::from_ref(&per.slots[1]) as usize;
        assert!(b - a >= 128);
    }
}
