//! J1: limit each user to 100 requests per minute in an axum handler, with
//! 429 + `Retry-After` and the `RateLimit` headers, no layer. Names three
//! nolock items: `Client`, `quota!` and `client::RateLimit`. The check's
//! answer is itself a response (feature `axum`), so the handler returns it
//! without naming its types.
//!
//! ```text
//! cargo run --example j1_handler --features axum
//! curl -i -H 'x-user: alice' http://127.0.0.1:3000/hello
//! ```
//!
//! Environment: `REDIS_URL` (default `redis://127.0.0.1/`), `PORT` (default
//! 3000). A request without `x-user` is answered `401` and never reaches
//! the limit: there is no "anonymous, unlimited" path. The test below
//! (`cargo test --example j1_handler --features axum`) starts its own
//! redis-server unless `REDIS_URL` is set.

use axum::extract::{FromRequestParts, State};
use axum::http::{request::Parts, StatusCode};
use axum::response::IntoResponse;
use axum::{routing::get, Router};
use nolock::client::RateLimit;
use nolock::Client;

#[cfg(test)]
#[path = "../tests/support/server.rs"]
mod server;

/// The service: `GET /hello`, 100 per minute per user.
pub fn app(client: &Client) -> nolock::Result<Router> {
    let per_user = client.rate_limit("per-user", nolock::quota!(100 per minute))?;
    Ok(Router::new()
        .route("/hello", get(hello))
        .with_state(per_user))
}

/// The check's answer is the response: a denial is 429 with
/// `RateLimit-Policy`, `RateLimit` and `Retry-After` (503 when Redis does
/// not answer); an admission adds `RateLimit-Policy` and `RateLimit` to the
/// handler's own response. (In a handler that does more, `?` on the check
/// returns the denial early: its error type is `client::Rejection`.)
async fn hello(State(per_user): State<RateLimit>, User(user): User) -> impl IntoResponse {
    let answer = per_user.check(&user).await;
    answer.map(|admitted| (admitted, format!("hello {user}\n")))
}

/// Who is calling: the `x-user` header here, an authenticated user id in a
/// real service. Missing or empty: `401`, before any limit.
struct User(String);

impl<S: Send + Sync> FromRequestParts<S> for User {
    type Rejection = (StatusCode, &'static str);

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .headers
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .filter(|user| !user.is_empty())
            .map(|user| User(user.to_owned()))
            .ok_or((StatusCode::UNAUTHORIZED, "who are you? send x-user\n"))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1/".into());
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let client = Client::connect(url).await?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on 127.0.0.1:{port}");
    axum::serve(listener, app(&client)?).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    use hyper::client::conn::http1::SendRequest;

    struct Reply {
        status: u16,
        retry_after: Option<String>,
        rate_limit: Option<String>,
        body: String,
    }

    async fn get(sender: &mut SendRequest<Empty<Bytes>>, user: Option<&str>) -> Reply {
        let mut request = hyper::Request::get("/hello").header("host", "localhost");
        if let Some(user) = user {
            request = request.header("x-user", user);
        }
        let response = sender
            .send_request(request.body(Empty::new()).unwrap())
            .await
            .unwrap();
        let header = |name: &str| {
            let value = response.headers().get(name)?;
            Some(value.to_str().unwrap().to_owned())
        };
        let (retry_after, rate_limit) = (header("retry-after"), header("ratelimit"));
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            retry_after,
            rate_limit,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    #[tokio::test]
    async fn the_101st_request_of_a_minute_gets_429_and_no_identity_gets_401() {
        let (url, _server) = server::url_from_env_or_start();
        let client = Client::connect(url).await.unwrap();
        // A user of its own, for a shared REDIS_URL.
        let alice = format!("alice-{}", std::process::id());
        client
            .rate_limit("per-user", nolock::quota!(100 per minute))
            .unwrap()
            .reset(&alice)
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = app(&client).unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);

        // GCRA, 100 per minute: a full limit admits 100 at once, then one
        // more every 600 ms. Requests are sent until the first 429; on a
        // run under 600 ms (the usual case) that is exactly the 101st.
        let start = std::time::Instant::now();
        let mut admitted = 0u64;
        let reply = loop {
            let reply = get(&mut sender, Some(&alice)).await;
            if reply.status != 200 || admitted == 200 {
                break reply;
            }
            admitted += 1;
            assert_eq!(reply.retry_after, None);
            assert!(reply.rate_limit.unwrap().starts_with("\"per-user\";r="));
        };
        let refilled = (start.elapsed().as_millis() / 600) as u64;
        assert!(
            (100..=100 + refilled).contains(&admitted),
            "{admitted} admitted, {refilled} refilled"
        );
        assert_eq!(reply.status, 429, "{}", reply.body);
        // Less than a second until one request fits: Retry-After rounds up.
        assert_eq!(reply.retry_after.as_deref(), Some("1"));
        assert!(reply.rate_limit.unwrap().starts_with("\"per-user\";r=0;"));
        assert!(!reply.body.is_empty());

        for _ in 0..3 {
            let reply = get(&mut sender, None).await;
            assert_eq!(reply.status, 401);
            assert!(reply.rate_limit.is_none() && reply.retry_after.is_none());
        }
        // Another user has a full limit of their own.
        let bob = format!("bob-{}", std::process::id());
        let reply = get(&mut sender, Some(&bob)).await;
        assert_eq!(reply.status, 200);
    }
}
