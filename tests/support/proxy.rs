//! A fault-injecting TCP proxy between clients and one `redis-server`, on
//! loopback only.
//!
//! Clients connect to [`FaultProxy::port`]; each connection gets its own
//! upstream connection and two pumps. Faults, all switchable at run time:
//!
//! * [`FaultProxy::lose_replies`]: the next `n` connections that forward a
//!   request are cut before the reply to it comes back. The server ran the
//!   request; the client sees its connection drop (an indeterminate call).
//! * [`FaultProxy::set_delay`]: every reply chunk waits this long.
//! * [`FaultProxy::hold`] / [`FaultProxy::release`]: replies stop flowing
//!   until released (requests still reach the server).
//! * [`FaultProxy::refuse`]: stop listening, so new connections are refused
//!   (`ECONNREFUSED`); [`FaultProxy::accept`] listens again on the same port.
//! * [`FaultProxy::cut_all`]: close every open connection at once.
//! * [`FaultProxy::partition`]: requests *and* replies stop flowing (both
//!   directions, as a network partition); [`FaultProxy::heal`] lets both go.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{watch, Notify};

/// Counters of what the proxy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProxyStats {
    pub connections: u64,
    pub replies_lost: u64,
    pub cuts: u64,
}

struct State {
    upstream: u16,
    lose: AtomicU64,
    delay_ms: AtomicU64,
    held: watch::Sender<bool>,
    requests_held: watch::Sender<bool>,
    refusing: AtomicBool,
    listen_changed: Notify,
    generation: watch::Sender<u64>,
    connections: AtomicU64,
    replies_lost: AtomicU64,
    cuts: AtomicU64,
}

/// The proxy; stops when dropped.
pub struct FaultProxy {
    pub port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

fn bind(port: u16) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
    socket.listen(1024)
}

impl FaultProxy {
    /// Start a proxy to `127.0.0.1:<upstream>` on a free port.
    pub async fn start(upstream: u16) -> FaultProxy {
        let listener = bind(0).expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let state = Arc::new(State {
            upstream,
            lose: AtomicU64::new(0),
            delay_ms: AtomicU64::new(0),
            held: watch::channel(false).0,
            requests_held: watch::channel(false).0,
            refusing: AtomicBool::new(false),
            listen_changed: Notify::new(),
            generation: watch::channel(0).0,
            connections: AtomicU64::new(0),
            replies_lost: AtomicU64::new(0),
            cuts: AtomicU64::new(0),
        });
        let task = tokio::spawn(accept_loop(listener, port, state.clone()));
        FaultProxy { port, state, task }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A reconnecting connection through the proxy: after a cut, the next
    /// request goes over a new socket.
    pub async fn manager(&self) -> redis::aio::ConnectionManager {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_manager()
            .await
            .expect("connect through the proxy")
    }

    pub fn lose_replies(&self, connections: u64) {
        self.state.lose.fetch_add(connections, SeqCst);
    }

    pub fn set_delay(&self, delay: Duration) {
        self.state.delay_ms.store(delay.as_millis() as u64, SeqCst);
    }

    pub fn hold(&self) {
        self.state.held.send_replace(true);
    }

    pub fn release(&self) {
        self.state.held.send_replace(false);
    }

    /// Hold both directions: nothing reaches the server, nothing comes back.
    pub fn partition(&self) {
        self.state.requests_held.send_replace(true);
        self.state.held.send_replace(true);
    }

    pub fn refuse(&self) {
        self.state.refusing.store(true, SeqCst);
        self.state.listen_changed.notify_one();
    }

    pub fn accept(&self) {
        self.state.refusing.store(false, SeqCst);
        self.state.listen_changed.notify_one();
    }

    pub fn cut_all(&self) {
        self.state.cuts.fetch_add(1, SeqCst);
        self.state.generation.send_modify(|g| *g += 1);
    }

    /// Back to a clean pass-through (open connections stay).
    pub fn heal(&self) {
        self.state.lose.store(0, SeqCst);
        self.set_delay(Duration::ZERO);
        self.state.requests_held.send_replace(false);
        self.release();
        self.accept();
    }

    pub fn stats(&self) -> ProxyStats {
        ProxyStats {
            connections: self.state.connections.load(SeqCst),
            replies_lost: self.state.replies_lost.load(SeqCst),
            cuts: self.state.cuts.load(SeqCst),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut_all();
    }
}

async fn accept_loop(listener: TcpListener, port: u16, state: Arc<State>) {
    let mut listener = Some(listener);
    loop {
        if state.refusing.load(SeqCst) {
            // Closing the listening socket makes connects fail with ECONNREFUSED.
            listener = None;
            state.listen_changed.notified().await;
            continue;
        }
        let Some(current) = listener.as_ref() else {
            match bind(port) {
                Ok(l) => listener = Some(l),
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
            continue;
        };
        tokio::select! {
            accepted = current.accept() => {
                if let Ok((client, _)) = accepted {
                    state.connections.fetch_add(1, SeqCst);
                    tokio::spawn(serve(client, state.clone()));
                }
            }
            _ = state.listen_changed.notified() => {}
        }
    }
}

async fn serve(client: TcpStream, state: Arc<State>) {
    let Ok(upstream) = TcpStream::connect(("127.0.0.1", state.upstream)).await else {
        return; // dropping `client` closes it: the server is down
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut up_read, mut up_write) = upstream.into_split();
    let mut generation = state.generation.subscribe();
    generation.borrow_and_update();
    // Set when a request was forwarded on a connection chosen to lose the
    // reply: the next reply bytes are dropped with the connection.
    let doomed = Arc::new(AtomicBool::new(false));

    let requests = {
        let (state, doomed) = (state.clone(), doomed.clone());
        let mut requests_held = state.requests_held.subscribe();
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match client_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if !doomed.load(SeqCst)
                    && state
                        .lose
                        .fetch_update(SeqCst, SeqCst, |l| l.checked_sub(1))
                        .is_ok()
                {
                    doomed.store(true, SeqCst);
                }
                if requests_held.wait_for(|h| !*h).await.is_err() {
                    return;
                }
                if up_write.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let replies = {
        let (state, doomed) = (state.clone(), doomed.clone());
        let mut held = state.held.subscribe();
        async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match up_read.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if doomed.load(SeqCst) {
                    state.replies_lost.fetch_add(1, SeqCst);
                    return;
                }
                let delay = state.delay_ms.load(SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                if held.wait_for(|h| !*h).await.is_err() {
                    return;
                }
                if client_write.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    // The first side to finish (or a cut) ends the connection: every half is
    // dropped, which closes both sockets.
    tokio::select! {
        _ = requests => {}
        _ = replies => {}
        _ = generation.changed() => {}
    }
}

/// The proxy's shared switches, for a fault task that outlives a borrow.
pub type SharedProxy = Arc<FaultProxy>;
