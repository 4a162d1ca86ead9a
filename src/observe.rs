//! Tracing spans and metrics, in one place.
//!
//! The engine calls these hooks at a handful of points (a script call ends,
//! a `NOSCRIPT` fallback, a cluster redirect, a batch ends, a lease is lost,
//! a rate decision, a failure-policy fallback). Each hook compiles to nothing
//! without the `tracing` and `metrics` features, so the core pays nothing.
//!
//! **Tracing** (`tracing` feature): one span `nolock.script` per script
//! call, with fields `script` (its path under `lua/`), `outcome` (`ok`,
//! `definite`, `indeterminate`), `fallback` (a `NOSCRIPT` made it load the
//! script and send it again), `redirects` (cluster `MOVED`/`READONLY` resends); one span
//! `nolock.batch` per [`crate::Batch::run`] (`script`, `size`, `errors`).
//! Keys are never recorded unless [`record_keys_in_spans`] turns it on (a key
//! often holds a user id or an IP address). Events: `debug` on a `NOSCRIPT`
//! fallback, `warn` on a lost lease and on a failure-policy fallback,
//! `error` when a tower layer answers `500` to a request it could not decide
//! (its input was invalid: field `problem`, never a key).
//!
//! **Metrics** (`metrics` feature, the `metrics` facade; install any
//! recorder):
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `nolock_decisions_total` | counter | `limiter` (its name), `decision` (`allowed`/`denied`) |
//! | `nolock_errors_total` | counter | `script`, `kind` (`definite`/`indeterminate`) |
//! | `nolock_noscript_fallbacks_total` | counter | `script` |
//! | `nolock_redirects_total` | counter | `script` |
//! | `nolock_lease_losses_total` | counter | |
//! | `nolock_layer_failures_total` | counter | `layer` (`rate`/`concurrency`) |
//! | `nolock_fallback_decisions_total` | counter | `policy` (`fail_open`/`fail_closed`/`local`) |
//! | `nolock_operation_duration_seconds` | histogram | `script` |
//!
//! **Never recorded**: what grants power over a holding or a record (lock
//! tokens, permit ids, charge ids, operation ids, and the keys derived from
//! them). Their `Debug` shows [`Redacted`], error messages leave them out,
//! and no span field or label carries them; the values stay reachable
//! through explicit accessors (`as_str()`, `id()`).
// Each hook uses its arguments under one feature or the other: with only
// one of them (or none), some go unused.
#![cfg_attr(
    not(all(feature = "metrics", feature = "tracing")),
    allow(unused_variables, dead_code, clippy::unused_self)
)]

#[cfg(feature = "tracing")]
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;

use crate::Error;

#[cfg(feature = "tracing")]
static RECORD_KEYS: AtomicBool = AtomicBool::new(false);

/// Record the first key of each script call in its span (field `key`).
/// Off by default: keys often name users or addresses.
///
/// ```
/// nolock::record_keys_in_spans(true);
/// # nolock::record_keys_in_spans(false);
/// ```
#[cfg(feature = "tracing")]
pub fn record_keys_in_spans(on: bool) {
    RECORD_KEYS.store(on, Relaxed);
}

/// What `Debug` shows in place of a secret (a token, an id, a key derived
/// from one): `<redacted>`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Redacted;

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One script call, from its first send to its result.
#[derive(Debug)]
pub(crate) struct Call {
    script: &'static str,
    start: Instant,
    fallback: bool,
    redirects: u32,
    #[cfg(feature = "tracing")]
    span: tracing::Span,
}

impl Call {
    /// `first_key` is recorded only when [`record_keys_in_spans`] is on.
    pub(crate) fn start(script: &'static str, first_key: impl FnOnce() -> Option<String>) -> Call {
        Call {
            script,
            start: Instant::now(),
            fallback: false,
            redirects: 0,
            #[cfg(feature = "tracing")]
            span: {
                let span = tracing::info_span!(
                    "nolock.script",
                    script,
                    outcome = tracing::field::Empty,
                    fallback = false,
                    redirects = 0u32,
                    key = tracing::field::Empty,
                );
                if RECORD_KEYS.load(Relaxed) {
                    if let Some(key) = first_key() {
                        span.record("key", key.as_str());
                    }
                }
                span
            },
        }
    }

    pub(crate) fn noscript(&mut self) {
        self.fallback = true;
        #[cfg(feature = "tracing")]
        {
            self.span.record("fallback", true);
            tracing::debug!(parent: &self.span, script = self.script, "NOSCRIPT: loading the script and sending it again");
        }
        #[cfg(feature = "metrics")]
        metrics::counter!("nolock_noscript_fallbacks_total", "script" => self.script).increment(1);
    }

    pub(crate) fn redirect(&mut self) {
        self.redirects += 1;
        #[cfg(feature = "tracing")]
        self.span.record("redirects", self.redirects);
        #[cfg(feature = "metrics")]
        metrics::counter!("nolock_redirects_total", "script" => self.script).increment(1);
    }

    pub(crate) fn finish<T>(self, result: &Result<T, Error>) {
        let outcome = outcome(result);
        #[cfg(feature = "tracing")]
        self.span.record("outcome", outcome);
        #[cfg(feature = "metrics")]
        {
            if outcome != "ok" {
                metrics::counter!("nolock_errors_total", "script" => self.script, "kind" => outcome)
                    .increment(1);
            }
            metrics::histogram!("nolock_operation_duration_seconds", "script" => self.script)
                .record(self.start.elapsed().as_secs_f64());
        }
    }
}

fn outcome<T>(result: &Result<T, Error>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) if e.is_definite() => "definite",
        Err(_) => "indeterminate",
    }
}

/// A whole [`crate::Batch::run`]: its span opens before anything is sent
/// (so the entries' own spans nest in it) and records the batch's `script`
/// (of its first entry), `size` and, at the end, `errors`. Entries also
/// count as calls for the error counters and the duration histogram (one
/// sample per batch).
#[derive(Debug)]
pub(crate) struct BatchRun {
    script: &'static str,
    start: Instant,
    #[cfg(feature = "tracing")]
    span: tracing::Span,
}

impl BatchRun {
    pub(crate) fn start(script: Option<&'static str>, size: usize) -> BatchRun {
        let script = script.unwrap_or("none");
        BatchRun {
            script,
            start: Instant::now(),
            #[cfg(feature = "tracing")]
            span: tracing::info_span!("nolock.batch", script, size, errors = tracing::field::Empty),
        }
    }

    /// Runs `work` inside the batch's span.
    pub(crate) async fn within<F: std::future::Future>(&self, work: F) -> F::Output {
        #[cfg(feature = "tracing")]
        {
            use tracing::Instrument;
            work.instrument(self.span.clone()).await
        }
        #[cfg(not(feature = "tracing"))]
        {
            work.await
        }
    }

    pub(crate) fn finish<T>(self, results: &[Result<T, Error>]) {
        #[cfg(feature = "tracing")]
        self.span
            .record("errors", results.iter().filter(|r| r.is_err()).count());
        #[cfg(feature = "metrics")]
        {
            for result in results {
                let outcome = outcome(result);
                if outcome != "ok" {
                    metrics::counter!("nolock_errors_total", "script" => self.script, "kind" => outcome)
                        .increment(1);
                }
            }
            metrics::histogram!("nolock_operation_duration_seconds", "script" => self.script)
                .record(self.start.elapsed().as_secs_f64());
        }
    }
}

/// `NOSCRIPT` fallbacks inside a batch (counted per entry).
pub(crate) fn batch_noscript(script: Option<&'static str>, entries: u64) {
    #[cfg(feature = "tracing")]
    tracing::debug!(
        script,
        entries,
        "NOSCRIPT in a batch: loading their scripts and sending those entries again"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("nolock_noscript_fallbacks_total", "script" => script.unwrap_or("none"))
        .increment(entries);
}

/// A rate decision of the limiter named `limiter`.
pub(crate) fn decision(limiter: &str, allowed: bool) {
    #[cfg(feature = "metrics")]
    {
        let decision = if allowed { "allowed" } else { "denied" };
        metrics::counter!("nolock_decisions_total", "limiter" => limiter.to_owned(), "decision" => decision)
            .increment(1);
    }
}

/// A failure-policy fallback (`policy` is a `policy::DecidedBy` name; `cause`
/// the failure that led to it).
pub(crate) fn fallback(policy: &'static str, cause: &dyn std::fmt::Display) {
    #[cfg(feature = "tracing")]
    tracing::warn!(policy, %cause, "nolock: rate decision without Redis");
    #[cfg(feature = "metrics")]
    metrics::counter!("nolock_fallback_decisions_total", "policy" => policy).increment(1);
}

/// A tower layer answered `500`: the request's input was invalid (`problem`
/// says what, without any key).
pub(crate) fn layer_failure(layer: &'static str, problem: &str) {
    #[cfg(feature = "tracing")]
    tracing::error!(layer, problem, "nolock: a request could not be limited");
    #[cfg(feature = "metrics")]
    metrics::counter!("nolock_layer_failures_total", "layer" => layer).increment(1);
}

/// A lease was lost (expired or taken) while its holder still worked.
pub(crate) fn lease_lost() {
    #[cfg(feature = "tracing")]
    tracing::warn!("nolock: lease lost");
    #[cfg(feature = "metrics")]
    metrics::counter!("nolock_lease_losses_total").increment(1);
}

/// A handle decides by stored numbers that differ from its own.
pub(crate) fn config_differs(family: &'static str, name: &str, stored: &str, ours: &str) {
    let _ = (family, name, stored, ours);
    #[cfg(feature = "tracing")]
    tracing::warn!(
        family,
        name,
        stored,
        ours,
        "nolock: this process's numbers differ from the stored configuration; deciding by the stored ones"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("nolock_config_differs_total", "family" => family, "name" => name.to_owned())
        .increment(1);
}

/// The poll of the registry failed; the cached numbers stay in use.
pub(crate) fn config_poll_failed(err: &crate::Error) {
    let _ = err;
    #[cfg(feature = "tracing")]
    tracing::warn!(%err, "nolock: reading the stored configurations failed");
    #[cfg(feature = "metrics")]
    metrics::counter!("nolock_config_poll_failures_total").increment(1);
}

/// A call admitted without a decision by an unlimited configuration.
pub(crate) fn unlimited(family: &'static str, name: &str) {
    let _ = (family, name);
    #[cfg(feature = "metrics")]
    metrics::counter!("nolock_unlimited_total", "family" => family, "name" => name.to_owned())
        .increment(1);
}
