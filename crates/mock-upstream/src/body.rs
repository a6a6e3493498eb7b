//! The mocks' response body: either whole bytes or chunks fed through a channel, so one
//! type covers fixed, chunked, slow and streaming (SSE) answers.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

/// Response body of every mock.
#[derive(Debug)]
pub struct MockBody {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Full(Option<Bytes>),
    Stream {
        rx: mpsc::Receiver<Bytes>,
        /// Bytes still to come when the length is announced (content-length); `None`
        /// makes hyper use chunked transfer-encoding.
        remaining: Option<u64>,
    },
}

impl MockBody {
    /// An empty body.
    pub fn empty() -> MockBody {
        MockBody {
            inner: Inner::Full(None),
        }
    }

    /// A body of exactly these bytes (sent with a content-length).
    pub fn full(bytes: impl Into<Bytes>) -> MockBody {
        let bytes = bytes.into();
        MockBody {
            inner: Inner::Full((!bytes.is_empty()).then_some(bytes)),
        }
    }

    /// A body fed chunk by chunk through the returned sender; it ends when the sender is
    /// dropped. With `exact_len` the length is announced up front (content-length),
    /// without it the answer is chunked. A small channel keeps a slow reader's
    /// backpressure on the producer.
    pub fn channel(exact_len: Option<u64>) -> (mpsc::Sender<Bytes>, MockBody) {
        let (tx, rx) = mpsc::channel(4);
        (
            tx,
            MockBody {
                inner: Inner::Stream {
                    rx,
                    remaining: exact_len,
                },
            },
        )
    }
}

impl Body for MockBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match &mut self.get_mut().inner {
            Inner::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Inner::Stream { rx, remaining } => match rx.poll_recv(cx) {
                Poll::Ready(Some(chunk)) => {
                    if let Some(left) = remaining {
                        *left = left.saturating_sub(chunk.len() as u64);
                    }
                    Poll::Ready(Some(Ok(Frame::data(chunk))))
                }
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.inner, Inner::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(None) => SizeHint::with_exact(0),
            Inner::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Inner::Stream {
                remaining: Some(n), ..
            } => SizeHint::with_exact(*n),
            Inner::Stream { .. } => SizeHint::default(),
        }
    }
}
