//! Deadlines for every request on a connection, not only the first.
//!
//! actix-http times the head of a connection's *first* request only
//! (`client_request_timeout`), and its keep-alive timer stops at the first
//! byte of the next one. A client could so keep a connection for ever by
//! dribbling a second request head, or the rest of a body nobody reads, one
//! byte at a time. Every accepted socket is therefore wrapped in a
//! [`GuardedStream`] that shares a [`ConnState`] with the request middleware
//! [`mark_requests`] (through a per-worker table keyed by the peer address:
//! cheaper per held connection than actix's per-connection extensions):
//!
//! - while a request is being served (from its parsed head to the end of its
//!   response body, however long a stream is paused), nothing is timed here;
//! - once a response has ended, the next request's head must be complete
//!   within the keep-alive idle time plus `--request-timeout`, and within
//!   `--request-timeout` of its first byte; leftover body bytes that actix
//!   drains count the same. Past the deadline the next read fails and actix
//!   closes the connection.
//!
//! The body of one request is timed by its handler (`--request-timeout`, 408
//! and `Connection: close`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{BodySize, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::Error;
use bytes::Bytes;
use futures_util::future::LocalBoxFuture;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// Default of `--request-timeout`: time allowed for a request head, and
/// again for its body.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a kept-alive connection may sit idle between requests.
pub const KEEP_ALIVE_IDLE: Duration = Duration::from_secs(5);

/// What the socket wrapper and the middleware of one connection share. Both
/// live on the connection's worker thread, hence `Rc` and `Cell`.
#[derive(Debug)]
pub struct ConnState {
    /// A request is being served: its head was parsed, its response body
    /// has not ended.
    in_request: Cell<bool>,
    /// When the next request's head must be complete; `None` while serving.
    deadline: Cell<Option<Instant>>,
    /// The deadline was already shortened at the next head's first byte.
    head_started: Cell<bool>,
    head_timeout: Duration,
}

impl ConnState {
    fn new(head_timeout: Duration) -> ConnState {
        ConnState {
            in_request: Cell::new(false),
            deadline: Cell::new(None),
            head_started: Cell::new(false),
            head_timeout,
        }
    }

    fn request_started(&self) {
        self.in_request.set(true);
        self.deadline.set(None);
    }

    fn response_ended(&self) {
        self.in_request.set(false);
        self.head_started.set(false);
        self.deadline
            .set(Some(Instant::now() + KEEP_ALIVE_IDLE + self.head_timeout));
    }

    /// Bytes arrived between requests: the head they start has
    /// `head_timeout` from now, at most.
    fn bytes_between_requests(&self) {
        if self.in_request.get() || self.head_started.replace(true) {
            return;
        }
        let by_head = Instant::now() + self.head_timeout;
        let deadline = self.deadline.get().map_or(by_head, |d| d.min(by_head));
        self.deadline.set(Some(deadline));
    }
}

thread_local! {
    /// The guarded connections of this worker thread, by peer address (which
    /// no two open connections to one listening socket share). A
    /// connection's entry lives exactly as long as its [`GuardedStream`].
    static CONNECTIONS: RefCell<HashMap<SocketAddr, Rc<ConnState>>> =
        RefCell::new(HashMap::new());
}

/// An accepted socket whose reads fail once a request head is overdue.
pub struct GuardedStream {
    io: TcpStream,
    state: Rc<ConnState>,
    peer: Option<SocketAddr>,
    /// Armed while a deadline is set; allocated only then.
    timer: Option<Pin<Box<Sleep>>>,
}

impl GuardedStream {
    /// Wraps `io` and makes its state findable by [`mark_requests`] on this thread.
    pub fn new(io: TcpStream, head_timeout: Duration) -> GuardedStream {
        let state = Rc::new(ConnState::new(head_timeout));
        let peer = io.peer_addr().ok();
        if let Some(peer) = peer {
            CONNECTIONS.with_borrow_mut(|all| all.insert(peer, state.clone()));
        }
        GuardedStream {
            io,
            state,
            peer,
            timer: None,
        }
    }

    /// `Err` once the deadline has passed; otherwise the timer is armed so
    /// that the connection's task is woken when it does.
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(deadline) = self.state.deadline.get() else {
            self.timer = None;
            return Ok(());
        };
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "request head not complete in time",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl Drop for GuardedStream {
    fn drop(&mut self) {
        if let Some(peer) = self.peer {
            CONNECTIONS.with_borrow_mut(|all| {
                // Only our own entry (a new connection cannot reuse the
                // address before this one is closed, but be exact).
                if all.get(&peer).is_some_and(|s| Rc::ptr_eq(s, &self.state)) {
                    all.remove(&peer);
                }
            });
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check_deadline(cx)?;
        let filled = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > filled {
            this.state.bytes_between_requests();
            // The deadline may have moved closer: arm the timer for it.
            this.check_deadline(cx)?;
        }
        read
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Middleware: marks a connection busy from a request's head to the end of
/// its response body. Requests on connections that are not guarded (none
/// in the server) pass untouched.
///
/// The future is boxed, as in [`super::access_log`]: it is freed when the
/// response head is ready, while the body wrapper (one `Rc`) stays.
pub fn mark_requests<B: MessageBody + 'static>(
    req: ServiceRequest,
    next: Next<B>,
) -> LocalBoxFuture<'static, Result<ServiceResponse<MarkedBody<B>>, Error>> {
    Box::pin(async move {
        let state = req
            .peer_addr()
            .and_then(|peer| CONNECTIONS.with_borrow(|all| all.get(&peer).cloned()));
        if let Some(state) = &state {
            state.request_started();
        }
        let response = next.call(req).await?;
        Ok(response.map_body(|_, body| MarkedBody { body, state }))
    })
}

pin_project! {
    /// A response body that tells its connection when it has ended (or was
    /// dropped: a client that went away, or a shutdown).
    pub struct MarkedBody<B> {
        #[pin]
        body: B,
        state: Option<Rc<ConnState>>,
    }

    impl<B> PinnedDrop for MarkedBody<B> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(state) = this.project().state.take() {
                state.response_ended();
            }
        }
    }
}

impl<B: MessageBody> MessageBody for MarkedBody<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.project();
        let next = this.body.poll_next(cx);
        if let Poll::Ready(None) = next {
            // The body is complete: the connection is between requests now.
            if let Some(state) = this.state.take() {
                state.response_ended();
            }
        }
        next
    }
}
