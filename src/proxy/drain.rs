//! What shutdown waits for. Requests in flight on every connection are counted, except
//! long-lived `GET /mcp` event streams: those wait for events, not for an answer, and
//! would hold the drain until its deadline. Once nothing else is in flight they are
//! ended (a clean end of stream, after which the client reconnects elsewhere).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::{watch, Notify};

use crate::worker::PerWorker;

/// The process-wide count, kept per worker ([`crate::worker`]) so that a request counts
/// itself on its own worker's cache line, and the end-of-streams signal.
#[derive(Debug)]
pub(crate) struct Drain {
    shards: PerWorker<Arc<Shard>>,
    signal: Arc<Signal>,
    streams_end: watch::Sender<bool>,
}

/// One worker's count of requests in flight.
#[derive(Debug)]
struct Shard {
    ordinary: AtomicUsize,
    signal: Arc<Signal>,
}

/// Wakes the drain when a count reaches zero, once the drain waits for it.
#[derive(Debug, Default)]
struct Signal {
    /// Set by [`Drain::until_idle`]: before it, a count reaching zero wakes nobody (and
    /// takes no lock).
    waiting: AtomicBool,
    idle: Notify,
}

impl Drain {
    /// A drain counting the requests of `workers` workers.
    pub(crate) fn new(workers: usize) -> Drain {
        let signal = Arc::new(Signal::default());
        Drain {
            shards: PerWorker::new(workers, |_| {
                Arc::new(Shard {
                    ordinary: AtomicUsize::new(0),
                    signal: Arc::clone(&signal),
                })
            }),
            signal,
            streams_end: watch::Sender::new(false),
        }
    }

    /// Counts one request (not an event stream) until the guard is dropped.
    pub(crate) fn begin(&self) -> Ordinary {
        let shard = self.shards.get();
        shard.ordinary.fetch_add(1, Ordering::SeqCst);
        Ordinary {
            shard: Arc::clone(shard),
        }
    }

    /// Requests in flight, event streams not counted.
    pub(crate) fn in_flight(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.ordinary.load(Ordering::SeqCst))
            .sum()
    }

    /// Resolves once no counted request is in flight.
    pub(crate) async fn until_idle(&self) {
        // Sequentially consistent with the guards' decrement and check: either this
        // sum sees a guard's decrement, or that guard sees `waiting` and wakes us.
        self.signal.waiting.store(true, Ordering::SeqCst);
        loop {
            let notified = self.signal.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Ends every event stream wrapped by [`Drain::endable`], now and from now on.
    pub(crate) fn end_streams(&self) {
        self.streams_end.send_replace(true);
    }

    /// Wraps an event-stream body so that [`Drain::end_streams`] ends it.
    pub(crate) fn endable<B>(&self, inner: B) -> Endable<B> {
        let mut rx = self.streams_end.subscribe();
        let ended = Box::pin(async move {
            let _ = rx.wait_for(|end| *end).await;
        });
        Endable { inner, ended }
    }
}

/// One counted request.
#[derive(Debug)]
pub(crate) struct Ordinary {
    shard: Arc<Shard>,
}

impl Drop for Ordinary {
    fn drop(&mut self) {
        let was = self.shard.ordinary.fetch_sub(1, Ordering::SeqCst);
        if was == 1 && self.shard.signal.waiting.load(Ordering::SeqCst) {
            self.shard.signal.idle.notify_waiters();
        }
    }
}

/// A body that ends early, cleanly, when the streams are ended.
pub(crate) struct Endable<B> {
    inner: B,
    ended: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl<B: Body + Unpin> Body for Endable<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        if this.ended.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt;

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    #[tokio::test]
    async fn idle_waits_for_the_last_guard_of_every_worker() {
        let drain = Arc::new(Drain::new(2));
        drain.until_idle().await;
        let a = drain.begin();
        // The second on worker 1: the drain waits for every worker's count.
        crate::worker::enter(1);
        let b = drain.begin();
        crate::worker::enter(0);
        assert_eq!(drain.in_flight(), 2);
        let waiter = {
            let drain = Arc::clone(&drain);
            tokio::spawn(async move { drain.until_idle().await })
        };
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(b);
        waiter.await.unwrap();
    }

    /// An event stream with no events: never a frame, never the end.
    struct Quiet;

    impl Body for Quiet {
        type Data = Bytes;
        type Error = BoxError;

        fn poll_frame(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn ending_streams_ends_a_quiet_body() {
        let drain = Drain::new(1);
        let mut body = drain.endable(Quiet);
        let next = tokio::time::timeout(std::time::Duration::from_millis(50), body.frame()).await;
        assert!(next.is_err(), "still open");
        drain.end_streams();
        assert!(body.frame().await.is_none());
        // A stream opened after the signal ends at once.
        let mut late = drain.endable(Quiet);
        assert!(late.frame().await.is_none());
    }
}
