//! Passthrough deadlines that never cut an exchange still making progress (the gateway's
//! imports and exports answer slowly): a body may pause for at most the idle gap between
//! frames, and the gateway's response head is awaited for at most the head timeout
//! counted from the last request byte sent, so a long upload is not mistaken for a
//! silent gateway.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::conn::BoxError;

/// A body paused longer than the idle gap.
#[derive(Debug, thiserror::Error)]
#[error("no body bytes within the idle gap")]
pub(crate) struct IdleGap;

/// When a body last moved, shared with whoever waits on the other side of it.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    base: Instant,
    last_ms: Arc<AtomicU64>,
}

impl Progress {
    pub(crate) fn new() -> Progress {
        Progress {
            base: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    fn mark(&self) {
        let ms = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// The last time a frame passed (the start when none has).
    pub(crate) fn last(&self) -> Instant {
        self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// A body that fails when its source gives no frame for `gap` while it is being
/// polled. Time spent with nobody polling (the receiver applying backpressure) does not
/// count: the gap is the source's silence, not the reader's.
pub(crate) struct IdleBody<B> {
    inner: B,
    gap: Option<Duration>,
    sleep: Option<Pin<Box<Sleep>>>,
    /// Told of every frame, when someone waits on it (the request body's head wait);
    /// an answer body has nobody, and saves the clock read per frame.
    progress: Option<Progress>,
}

impl<B> IdleBody<B> {
    /// Wraps `inner`; `gap` of `None` only records progress, if any.
    pub(crate) fn new(inner: B, gap: Option<Duration>, progress: Option<Progress>) -> IdleBody<B> {
        IdleBody {
            inner,
            gap,
            sleep: None,
            progress,
        }
    }
}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.sleep = None;
                if let Some(progress) = &this.progress {
                    progress.mark();
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let Some(gap) = this.gap else {
                    return Poll::Pending;
                };
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(IdleGap)))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Awaits `response` until it resolves, or until `head` has passed since the later of the
/// call and the last request-body progress; `None` on that timeout.
pub(crate) async fn await_head<F: Future>(
    response: F,
    head: Duration,
    progress: &Progress,
) -> Option<F::Output> {
    tokio::pin!(response);
    loop {
        let deadline = progress.last() + head;
        tokio::select! {
            out = &mut response => return Some(out),
            () = tokio::time::sleep_until(deadline) => {
                if progress.last() + head <= Instant::now() {
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// Frames of one byte, each after its own pause.
    struct Drip {
        gaps_ms: std::collections::VecDeque<u64>,
        sleep: Option<Pin<Box<Sleep>>>,
    }

    fn dripping(gaps_ms: Vec<u64>) -> Drip {
        Drip {
            gaps_ms: gaps_ms.into(),
            sleep: None,
        }
    }

    impl Body for Drip {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            let this = self.get_mut();
            let Some(&gap) = this.gaps_ms.front() else {
                return Poll::Ready(None);
            };
            let sleep = this
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(gap))));
            match sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.sleep = None;
                    this.gaps_ms.pop_front();
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
                }
                Poll::Pending => Poll::Pending,
            }
        }
    }

    // Real time, in tens of milliseconds: slack of 2–3× each way keeps a busy machine
    // from turning a pause into a stall or the reverse.
    #[tokio::test]
    async fn a_body_that_keeps_moving_is_never_cut() {
        let body = IdleBody::new(
            dripping(vec![60, 60, 60, 60, 60]),
            Some(Duration::from_millis(200)),
            None,
        );
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(all.len(), 5);
    }

    #[tokio::test]
    async fn a_pause_longer_than_the_gap_fails() {
        let body = IdleBody::new(
            dripping(vec![20, 600]),
            Some(Duration::from_millis(200)),
            None,
        );
        let err = body.collect().await.unwrap_err();
        assert!(err.is::<IdleGap>());
    }

    #[tokio::test]
    async fn the_head_wait_restarts_with_request_progress() {
        let progress = Progress::new();
        let p = progress.clone();
        let head = Duration::from_millis(250);
        let answer = async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_millis(80)).await;
                p.mark();
            }
            tokio::time::sleep(Duration::from_millis(80)).await;
            "answer"
        };
        // 480 ms in all, beyond the head timeout, but never 250 ms without progress.
        assert_eq!(await_head(answer, head, &progress).await, Some("answer"));
        let silent = tokio::time::sleep(Duration::from_secs(10));
        assert!(await_head(silent, head, &Progress::new()).await.is_none());
    }
}
