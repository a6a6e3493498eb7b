//! HTTP/2 answers waiting for the client's flow-control window.
//!
//! On HTTP/1 a client that stops reading stops the socket, and [`super::conn::ConnIo`]
//! closes the connection once a write has waited for the write-stall limit. On HTTP/2 a
//! client can stop taking one answer by granting its stream no window while the socket
//! stays writable: hyper then holds the answer's next chunk and stops polling its body,
//! and whatever the answer holds (its place at the gateway, buffered bytes, an upstream
//! connection) would be held for as long as the client likes. So each HTTP/2 answer
//! records here when it handed hyper a chunk that hyper has not come back for, and the
//! connection's reads fail once one such chunk has waited for the write-stall limit,
//! which closes the connection as the HTTP/1 rule does.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame};
use tokio::time::{Instant, Sleep};

/// Chunks handed to hyper on one connection's HTTP/2 streams and not yet taken.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    /// Set once the connection has had an HTTP/2 request: only then is anything here
    /// looked at, so HTTP/1 connections pay one load of this flag per read.
    http2: AtomicBool,
    next_id: AtomicU64,
    book: Mutex<Book>,
}

#[derive(Debug, Default)]
struct Book {
    /// Each waiting answer and when it handed its chunk over; at most the connection's
    /// concurrent streams.
    since: Vec<(u64, Instant)>,
    /// The connection's reader, woken when the first answer starts waiting so that it
    /// arms its timer.
    reader: Option<Waker>,
}

impl Waiting {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A name for one HTTP/2 answer's entries.
    pub(crate) fn watch(&self) -> u64 {
        self.http2.store(true, Ordering::Release);
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Answer `id` handed hyper a chunk.
    pub(crate) fn handed(&self, id: u64) {
        let mut book = self.book();
        book.since.push((id, Instant::now()));
        if book.since.len() == 1 {
            if let Some(reader) = book.reader.take() {
                reader.wake();
            }
        }
    }

    /// Answer `id`'s chunk was taken, or the answer is gone.
    pub(crate) fn taken(&self, id: u64) {
        self.book().since.retain(|(waiting, _)| *waiting != id);
    }

    /// Whether a chunk has waited for `limit`, from the connection's reader: it keeps
    /// `timer` armed for the oldest waiting chunk, so the reader is woken when that one
    /// has waited for `limit`.
    #[inline]
    pub(crate) fn poll_stalled(
        &self,
        cx: &mut Context<'_>,
        timer: &mut Option<Pin<Box<Sleep>>>,
        limit: Duration,
    ) -> bool {
        self.http2.load(Ordering::Acquire) && self.poll_http2_stalled(cx, timer, limit)
    }

    // Out of line, so that HTTP/1 reads carry only the flag's load.
    #[inline(never)]
    fn poll_http2_stalled(
        &self,
        cx: &mut Context<'_>,
        timer: &mut Option<Pin<Box<Sleep>>>,
        limit: Duration,
    ) -> bool {
        let oldest = {
            let mut book = self.book();
            let oldest = book.since.iter().map(|(_, since)| *since).min();
            if oldest.is_none()
                && !book
                    .reader
                    .as_ref()
                    .is_some_and(|w| w.will_wake(cx.waker()))
            {
                book.reader = Some(cx.waker().clone());
            }
            oldest
        };
        let Some(oldest) = oldest else {
            *timer = None;
            return false;
        };
        let deadline = oldest + limit;
        let timer = match timer {
            Some(timer) => {
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                timer
            }
            None => timer.insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        matches!(timer.as_mut().poll(cx), Poll::Ready(()))
    }
}

/// Most of an answer hyper gets at once on HTTP/2: one DATA frame at the default frame
/// size. hyper hands a chunk to h2 once the stream has any window at all, and h2 keeps
/// what does not fit; sliced, the next slice stays with hyper and is seen waiting.
pub(crate) const SLICE: usize = 16 * 1024;

/// One HTTP/2 answer's record in [`Waiting`]: whether its last slice is still with
/// hyper, and the rest of a chunk larger than [`SLICE`].
#[derive(Debug)]
pub(crate) struct Watch {
    id: u64,
    out: bool,
    rest: Bytes,
}

impl Watch {
    pub(crate) fn new(waiting: &Waiting) -> Watch {
        Watch {
            id: waiting.watch(),
            out: false,
            rest: Bytes::new(),
        }
    }

    /// The next frame of `body` for hyper, a slice at a time, recording it as waiting
    /// until hyper comes back for another.
    // Out of line, so that HTTP/1 answers, which never come here, stay small.
    #[inline(never)]
    pub(crate) fn poll_frame<B>(
        &mut self,
        waiting: &Waiting,
        body: Pin<&mut B>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>>
    where
        B: Body<Data = Bytes>,
    {
        self.gone(waiting);
        let mut slice = if self.rest.is_empty() {
            match ready!(body.poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return Poll::Ready(other),
            }
        } else {
            std::mem::take(&mut self.rest)
        };
        if slice.len() > SLICE {
            self.rest = slice.split_off(SLICE);
        }
        // An empty frame needs no window.
        if !slice.is_empty() {
            waiting.handed(self.id);
            self.out = true;
        }
        Poll::Ready(Some(Ok(Frame::data(slice))))
    }

    /// Bytes of the current chunk not yet handed over.
    pub(crate) fn rest(&self) -> usize {
        self.rest.len()
    }

    /// hyper came back, or the answer is gone: the slice it had is no longer waiting.
    pub(crate) fn gone(&mut self, waiting: &Waiting) {
        if self.out {
            waiting.taken(self.id);
            self.out = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    const LIMIT: Duration = Duration::from_millis(300);

    async fn stalled(w: &Waiting, timer: &mut Option<Pin<Box<Sleep>>>) -> bool {
        poll_fn(|cx| Poll::Ready(w.poll_stalled(cx, timer, LIMIT))).await
    }

    /// A body of one data frame.
    struct One(Option<Bytes>);

    impl Body for One {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.get_mut().0.take().map(|b| Ok(Frame::data(b))))
        }
    }

    fn frame(watch: &mut Watch, w: &Waiting, body: &mut One) -> Option<usize> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match watch.poll_frame(w, Pin::new(body), &mut cx) {
            Poll::Ready(Some(Ok(frame))) => frame.into_data().ok().map(|d| d.len()),
            _ => None,
        }
    }

    /// Hands one frame of `len` bytes.
    fn hand(watch: &mut Watch, w: &Waiting, len: usize) {
        let mut body = One(Some(Bytes::from(vec![b'x'; len])));
        assert_eq!(frame(watch, w, &mut body), Some(len));
    }

    #[test]
    fn large_chunks_are_handed_over_a_slice_at_a_time() {
        let w = Waiting::default();
        let mut watch = Watch::new(&w);
        let mut body = One(Some(Bytes::from(vec![b'x'; 2 * SLICE + 5])));
        let slices: Vec<_> = std::iter::from_fn(|| frame(&mut watch, &w, &mut body)).collect();
        assert_eq!(slices, [SLICE, SLICE, 5]);
        assert_eq!(watch.rest(), 0);
        watch.gone(&w);
        assert!(w.book().since.is_empty());
    }

    async fn pause(ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    #[tokio::test]
    async fn a_chunk_waiting_past_the_limit_is_a_stall() {
        let w = Waiting::default();
        let mut timer = None;
        let mut a = Watch::new(&w);
        let mut b = Watch::new(&w);
        assert!(!stalled(&w, &mut timer).await);
        hand(&mut a, &w, 10);
        pause(200).await;
        hand(&mut b, &w, 10);
        assert!(!stalled(&w, &mut timer).await);
        // `a` is taken: only `b` waits, handed 200 ms later.
        a.gone(&w);
        pause(200).await;
        assert!(!stalled(&w, &mut timer).await);
        pause(150).await;
        assert!(stalled(&w, &mut timer).await);
        b.gone(&w);
        assert!(!stalled(&w, &mut timer).await);
        assert!(timer.is_none());
    }

    #[tokio::test]
    async fn empty_chunks_and_http1_connections_are_not_watched() {
        let w = Waiting::default();
        let mut timer = None;
        // No HTTP/2 answer yet: nothing is looked at, whatever the book holds.
        w.book().since.push((99, Instant::now()));
        pause(400).await;
        assert!(!stalled(&w, &mut timer).await);
        w.book().since.clear();
        let mut a = Watch::new(&w);
        hand(&mut a, &w, 0);
        pause(400).await;
        assert!(!stalled(&w, &mut timer).await);
    }

    #[tokio::test]
    async fn the_first_waiting_chunk_wakes_the_reader() {
        let w = std::sync::Arc::new(Waiting::default());
        let mut watch = Watch::new(&w);
        let reader = {
            let w = std::sync::Arc::clone(&w);
            tokio::spawn(async move {
                let mut timer = None;
                poll_fn(|cx| {
                    if w.poll_stalled(cx, &mut timer, LIMIT) {
                        Poll::Ready(())
                    } else {
                        Poll::Pending
                    }
                })
                .await;
            })
        };
        // The reader has polled once and sleeps with nothing waiting.
        pause(50).await;
        assert!(!reader.is_finished());
        hand(&mut watch, &w, 1);
        tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the reader saw the stall")
            .expect("the reader ran");
    }
}
