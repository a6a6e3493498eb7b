//! The workers: `runtime.threads` threads, each with a single-threaded event loop of its
//! own that accepts on the listening socket and serves the connections it accepted
//! start to finish, upstream exchanges included. Nothing moves a task between threads,
//! so a request wakes no other thread, and what a request touches per worker (its copy
//! of the shared handles, its upstream pools, its metric shards) no other thread writes.
//!
//! All workers accept on the same socket (each through its own registration of a
//! duplicate of it): whichever worker is free takes the next connection. Separate
//! `SO_REUSEPORT` sockets were not used: a second process binding the same port would
//! then succeed and silently take a share of the connections instead of failing to
//! start, and the kernel would spread connections by a hash, not by who is free.

use std::io;
use std::net::TcpListener as StdListener;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

use super::listener::accept_loop;
use super::ConnCtx;

/// The started workers; see [`Workers::wait`].
pub(super) struct Workers {
    done: Vec<oneshot::Receiver<()>>,
}

/// Starts `n` workers accepting on `listener` until `stop`; returns once each has its
/// event loop and its registration of the socket, or the first error.
pub(super) fn spawn(
    n: usize,
    listener: &StdListener,
    ctx: &ConnCtx,
    stop: &watch::Receiver<bool>,
) -> io::Result<Workers> {
    let mut done = Vec::with_capacity(n);
    let mut ready = Vec::with_capacity(n);
    for index in 0..n.max(1) {
        let socket = listener.try_clone()?;
        // Every worker its own copy of the handles, and of their reference counts.
        let mut ctx = ctx.clone();
        ctx.shared = Arc::new((*ctx.shared).clone());
        let ctx = Arc::new(ctx);
        let stop = stop.clone();
        let (finished, finished_rx) = oneshot::channel();
        let (started, started_rx) = std::sync::mpsc::sync_channel::<io::Result<()>>(1);
        std::thread::Builder::new()
            .name(format!("worker-{index}"))
            .spawn(move || {
                crate::worker::enter(index);
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return;
                    }
                };
                let registered = runtime.block_on(async { TcpListener::from_std(socket) });
                let listener = match registered {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return;
                    }
                };
                let _ = started.send(Ok(()));
                runtime.block_on(accept_loop(listener, ctx, stop));
                // Tasks still parked (an upstream pool's reaper) end with the loop.
                drop(runtime);
                let _ = finished.send(());
            })?;
        done.push(finished_rx);
        ready.push(started_rx);
    }
    for started in ready {
        match started.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("a worker stopped while starting")),
        }
    }
    Ok(Workers { done })
}

impl Workers {
    /// Resolves once every worker has drained and stopped; an error names a worker that
    /// ended without finishing (it panicked).
    pub(super) async fn wait(self) -> Result<(), String> {
        let mut failed = Vec::new();
        for (index, done) in self.done.into_iter().enumerate() {
            if done.await.is_err() {
                failed.push(index);
            }
        }
        match failed.as_slice() {
            [] => Ok(()),
            _ => Err(format!(
                "worker threads {failed:?} stopped without draining"
            )),
        }
    }
}
