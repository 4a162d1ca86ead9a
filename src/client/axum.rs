//! With the `axum` feature: a [`Rejection`] is a response, and an
//! [`Admitted`] adds its headers to one, so an axum 0.8 handler limits with
//! `?` and no layer.

use std::convert::Infallible;

use axum_core::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, StatusCode};

use super::{Admitted, Rejection};
use crate::rate::Headers;
use crate::Error;

/// Adds `RateLimit-Policy` and `RateLimit` to the handler's response.
///
/// ```
/// # #[cfg(feature = "axum")]
/// async fn hello(
///     limit: nolock::client::RateLimit,
///     user: String,
/// ) -> Result<(nolock::client::Admitted, String), nolock::client::Rejection> {
///     let admitted = limit.check(&user).await?;
///     Ok((admitted, format!("hello {user}\n")))
/// }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponseParts for Admitted {
    type Error = Infallible;

    fn into_response_parts(self, mut res: ResponseParts) -> Result<ResponseParts, Infallible> {
        insert(res.headers_mut(), &self.headers);
        Ok(res)
    }
}

/// 429 with the rate-limit headers when limited; 503 with `Retry-After: 1`
/// when Redis did not decide; 500 naming the problem otherwise. Never an
/// empty body. With the `tracing` feature, a failure is also a `warn`
/// event.
///
/// | answer | status | headers | body |
/// |---|---|---|---|
/// | [`Admitted`] (as response parts) | the handler's | `RateLimit-Policy`, `RateLimit` | the handler's |
/// | [`Rejection::Limited`] | 429 | `RateLimit-Policy`, `RateLimit`, `Retry-After` (whole seconds, rounded up; absent when the cost never fits) | `too many requests` |
/// | [`Rejection::Failed`], Redis error or timeout | 503 | `Retry-After: 1` | `rate limit unavailable` |
/// | [`Rejection::Failed`], anything else (bad input, a bad reply) | 500 | | the error |
///
/// ```
/// use axum::response::IntoResponse;
/// use nolock::client::Rejection;
///
/// let failed = Rejection::Failed(nolock::Error::EmptyKey);
/// assert_eq!(failed.into_response().status(), 500);
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        match self {
            Rejection::Limited(limited) => {
                let body = match &limited.headers.retry_after {
                    Some(seconds) => format!("too many requests: retry after {seconds} s\n"),
                    None => format!(
                        "too many requests: the cost is above the limit ({})\n",
                        limited.limit
                    ),
                };
                let mut res = (StatusCode::TOO_MANY_REQUESTS, body).into_response();
                insert(res.headers_mut(), &limited.headers);
                res
            }
            Rejection::Failed(err) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(error = %err, "nolock: no rate-limit decision");
                match err {
                    Error::Redis(_) | Error::Indeterminate(_) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [(RETRY_AFTER, HeaderValue::from_static("1"))],
                        "rate limit unavailable: Redis did not decide; retry later\n",
                    )
                        .into_response(),
                    other => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("rate limit not checked: {other}\n"),
                    )
                        .into_response(),
                }
            }
        }
    }
}

/// Copies the decision's headers. Their values are ASCII (policy names are
/// checked when a limit is built), so none is dropped in practice.
fn insert(map: &mut HeaderMap, headers: &Headers) {
    for (name, value) in headers.iter() {
        if let Ok(value) = HeaderValue::from_str(value) {
            if let Ok(name) = HeaderName::from_bytes(name.as_bytes()) {
                map.insert(name, value);
            }
        }
    }
}
