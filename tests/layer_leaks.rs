//! The concurrency layer never leaks what it takes: an acquire whose reply
//! comes after the layer's timeout (or never) leaves no permit behind, nor
//! does a request dropped while its acquire is on the wire; a request
//! dropped on its way (the client left, an outer timeout) gives back its
//! permit or its local fallback slot. Driven as a plain tower
//! service, so a test can drop a request's future where it likes.

mod support;

use std::convert::Infallible;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use nolock::layer::{ConcurrencyLimitLayer, Identity};
use nolock::policy::{Guard, OnFailure};
use nolock::semaphore::{self, Semaphore};
use support::proxy::FaultProxy;
use support::RedisServer;
use tower_layer::Layer;
use tower_service::Service;

/// An inner service that waits at its gate.
#[derive(Clone)]
struct Gated(Arc<tokio::sync::Semaphore>);

impl Service<http::Request<()>> for Gated {
    type Response = http::Response<String>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<()>) -> Self::Future {
        let gate = Arc::clone(&self.0);
        Box::pin(async move {
            let _pass = gate.acquire().await;
            Ok(http::Response::new("ok".to_owned()))
        })
    }
}

fn request() -> http::Request<()> {
    http::Request::builder().uri("/").body(()).unwrap()
}

fn layer(
    conn: redis::aio::MultiplexedConnection,
    on_failure: OnFailure,
) -> ConcurrencyLimitLayer<redis::aio::MultiplexedConnection> {
    let semaphore = Semaphore::new(2, Duration::from_secs(30)).unwrap();
    ConcurrencyLimitLayer::new(conn, semaphore, |_| {
        Identity::Limited("inflight:k".to_owned())
    })
    .guard(Guard::new(Duration::from_millis(50), on_failure).unwrap())
}

#[tokio::test]
async fn an_acquire_answered_after_the_timeout_leaves_no_permit_behind() {
    let redis = RedisServer::start();
    let mut direct = redis.conn().await;
    let (proxy, through) = through_a_proxy(&redis, &mut direct).await;
    let mut service =
        layer(through, OnFailure::Open).layer(Gated(Arc::new(tokio::sync::Semaphore::new(100))));
    // Replies now come 300 ms late: past the layer's 50 ms timeout, so it
    // falls back (Open) while the acquire has run on the server.
    proxy.set_delay(Duration::from_millis(300));
    let response = service.call(request()).await.unwrap();
    assert_eq!(response.status(), 200);
    // The layer released the id it asked under, right after the timeout:
    // the release reached the server behind the acquire, long before the
    // permit's 30 s TTL.
    tokio::time::sleep(Duration::from_millis(60)).await;
    let usage = semaphore::peek(&mut direct, "inflight:k").await.unwrap();
    assert_eq!(usage.in_use, 0, "no permit left behind");
}

/// A request dropped while its acquire is on the wire (the client left
/// before Redis answered): the script runs on the server anyway, and the
/// layer releases the id it asked under, so no permit is left behind.
#[tokio::test]
async fn a_request_dropped_during_its_acquire_leaves_no_permit_behind() {
    let redis = RedisServer::start();
    let mut direct = redis.conn().await;
    let (proxy, through) = through_a_proxy(&redis, &mut direct).await;
    let semaphore = Semaphore::new(2, Duration::from_secs(30)).unwrap();
    let mut service = ConcurrencyLimitLayer::new(through, semaphore, |_| {
        Identity::Limited("inflight:d".to_owned())
    })
    .guard(Guard::new(Duration::from_secs(5), OnFailure::Closed).unwrap())
    .layer(Gated(Arc::new(tokio::sync::Semaphore::new(100))));
    // Replies come 300 ms late; the request is dropped after 100 ms, with
    // the acquire run on the server and its reply still on the way.
    proxy.set_delay(Duration::from_millis(300));
    let mut call = Box::pin(service.call(request()));
    assert!(
        tokio::time::timeout(Duration::from_millis(100), &mut call)
            .await
            .is_err(),
        "still waiting for Redis"
    );
    assert_eq!(
        semaphore::peek(&mut direct, "inflight:d")
            .await
            .unwrap()
            .in_use,
        1,
        "the acquire ran on the server"
    );
    drop(call);
    // The release goes out behind the acquire on the same connection and
    // lands (300 ms of delay later) long before the permit's 30 s TTL.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let usage = semaphore::peek(&mut direct, "inflight:d").await.unwrap();
    assert_eq!(usage.in_use, 0, "no permit left behind");
}

#[tokio::test]
async fn a_dropped_request_gives_back_its_permit_and_its_local_slot() {
    let mut redis = RedisServer::start();
    let mut direct = redis.conn().await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut service = layer(redis.conn().await, OnFailure::Closed).layer(Gated(Arc::clone(&gate)));
    // A request holding a permit, dropped while the handler waits.
    let mut held = Box::pin(service.call(request()));
    assert!(futures_poll(&mut held).await.is_none(), "waits at the gate");
    assert_eq!(
        semaphore::peek(&mut direct, "inflight:k")
            .await
            .unwrap()
            .in_use,
        1
    );
    drop(held);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        semaphore::peek(&mut direct, "inflight:k")
            .await
            .unwrap()
            .in_use,
        0,
        "given back on drop"
    );

    // Redis gone: the local fallback admits 2 / 2 = 1 per key here.
    let one = NonZeroU32::new(2).unwrap();
    let mut local = layer(redis.conn().await, OnFailure::Local { replicas: one })
        .layer(Gated(Arc::clone(&gate)));
    redis.kill();
    let mut first = Box::pin(local.call(request()));
    assert!(
        futures_poll(&mut first).await.is_none(),
        "admitted locally, waiting at the gate"
    );
    let refused = local.call(request()).await.unwrap();
    assert_eq!(refused.status(), 429, "the one local slot is taken");
    drop(first); // the client went away
    let mut second = Box::pin(local.call(request()));
    assert!(
        futures_poll(&mut second).await.is_none(),
        "the slot came back: admitted"
    );
    gate.add_permits(1);
    assert_eq!(second.await.unwrap().status(), 200);
}

/// Scripts loaded (so the layer's acquire is one `EVALSHA`), and a
/// connection through a fault proxy in front of `redis`.
async fn through_a_proxy(
    redis: &RedisServer,
    direct: &mut redis::aio::MultiplexedConnection,
) -> (FaultProxy, redis::aio::MultiplexedConnection) {
    nolock::Scripts::load(direct).await.unwrap();
    let proxy = FaultProxy::start(redis.port).await;
    let through = redis::Client::open(proxy.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (proxy, through)
}

/// Polls `fut` until it is done or has waited 200 ms (a pending request).
async fn futures_poll<F: Future + Unpin>(fut: &mut F) -> Option<F::Output> {
    tokio::time::timeout(Duration::from_millis(200), fut)
        .await
        .ok()
}
