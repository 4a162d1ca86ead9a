//! Secrets stay out of what a service logs: lock tokens, permit ids, charge
//! ids and operation ids never appear in `Debug` or `Display` of a receipt,
//! an operation value, an answer or an error made with them, nor (with the
//! `tracing` and `metrics` features) in a span field or a metric label.
//! Each is still reachable through its accessor (`as_str()`, `id()`), and
//! the test reads it there to look for it everywhere else.

mod support;

use std::time::Duration;

use nolock::fence::{AcquireLock, ExtendLock, Lock, ReleaseLock};
use nolock::rate::{Algorithm, Limiter, MultiLimiter, Quota, RefundCharge};
use nolock::semaphore::{AcquirePermit, ExtendPermit, PermitId, ReleasePermit, Semaphore};
use nolock::{Batch, Error, Operation};
use support::{prefix, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

/// What was shown, by what showed it.
#[derive(Default)]
struct Shown(Vec<(String, String)>);

impl Shown {
    fn debug(&mut self, what: &str, value: &impl std::fmt::Debug) {
        self.0.push((what.to_owned(), format!("{value:?}")));
        self.0
            .push((format!("{what} (pretty)"), format!("{value:#?}")));
    }

    fn error(&mut self, what: &str, err: &Error) {
        self.debug(what, err);
        self.0.push((format!("{what} (Display)"), err.to_string()));
    }

    fn assert_none_of(&self, secrets: &[(&str, String)]) {
        for (kind, secret) in secrets {
            assert!(
                secret.len() >= 16,
                "{kind}: {secret:?} is no secret to look for"
            );
            for (what, text) in &self.0 {
                assert!(
                    !text.contains(secret.as_str()),
                    "the {kind} shows in {what}: {text}"
                );
            }
        }
    }
}

#[tokio::test]
async fn no_token_or_id_shows_in_debug_display_errors_spans_or_metrics() {
    #[cfg(all(feature = "tracing", feature = "metrics"))]
    let capture = telemetry::install();

    let server = RedisServer::start();
    let mut conn = server.conn().await;
    let p = prefix("redaction");
    let mut shown = Shown::default();
    let op_id = format!("op-{}", PermitId::random().unwrap().as_str());

    // A grant, its operation values and answers, a lease.
    let lock = Lock::new(MINUTE).unwrap();
    let acquire = AcquireLock::new(&lock, &format!("{p}r")).unwrap();
    shown.debug("AcquireLock", &acquire);
    let attempt = Batch::from_iter([acquire]).run(&mut conn).await.remove(0);
    let attempt = attempt.unwrap();
    shown.debug("LockAttempt", &attempt);
    let mut grant = attempt.acquired().expect("granted");
    let token = grant.token().as_str().to_owned();
    shown.debug("Token", grant.token());
    shown.debug("Grant", &grant);
    shown.debug("Fence", grant.fence());
    let extend = ExtendLock::new(&grant);
    shown.debug("ExtendLock", &extend);
    let answer = extend.run_in(&mut conn).await;
    shown.debug("LockExtension", &answer);
    grant.apply(&answer).unwrap();
    let release = ReleaseLock::new(&grant);
    shown.debug("ReleaseLock", &release);
    let once = release.clone().idempotent(op_id.as_str()).unwrap();
    shown.debug("Idempotent<ReleaseLock>", &once);
    assert_eq!(once.id(), op_id, "the id is there for who asks for it");
    let released = once.run(&mut conn).await.unwrap();
    assert_eq!(released, nolock::fence::LockRelease::Released);
    // The same id for another operation: refused, without naming the id.
    let other = ExtendLock::new(&grant).idempotent(op_id.as_str()).unwrap();
    let reused = other.run(&mut conn).await.unwrap_err();
    assert!(matches!(reused, Error::IdReused { .. }), "{reused}");
    shown.error("IdReused", &reused);

    let lease = lock
        .lease(conn.clone(), &format!("{p}leased"))
        .await
        .unwrap()
        .acquired()
        .expect("leased");
    let lease_token = lease.token().as_str().to_owned();
    shown.debug("Lease", &lease);

    // A permit, its operation values and answers, a permit lease, and the
    // errors of a permit restored with another weight.
    let sem = Semaphore::new(5, MINUTE).unwrap();
    let key = format!("{p}s");
    let id = PermitId::random().unwrap();
    let acquire = AcquirePermit::with_id(&sem, &key, &id, 3).unwrap();
    shown.debug("AcquirePermit", &acquire);
    shown.debug("PermitId", &id);
    let mut permit = Batch::from_iter([acquire])
        .run(&mut conn)
        .await
        .remove(0)
        .unwrap()
        .acquired()
        .expect("acquired");
    shown.debug("Permit", &permit);
    let extend = ExtendPermit::new(&permit);
    shown.debug("ExtendPermit", &extend);
    let answer = extend.run_in(&mut conn).await;
    shown.debug("PermitExtension", &answer);
    permit.apply(&answer).unwrap();
    shown.debug("ReleasePermit", &ReleasePermit::new(&permit));
    let once = ReleasePermit::new(&permit)
        .idempotent(format!("{op_id}-release"))
        .unwrap();
    shown.debug("Idempotent<ReleasePermit>", &once);
    let wrong = sem.restore(&key, id.clone(), 1).unwrap();
    shown.debug("restored Permit", &wrong);
    let mut wrong_again = sem.restore(&key, id.clone(), 2).unwrap();
    let err = wrong_again.extend(&mut conn).await.unwrap_err();
    assert!(matches!(err, Error::PermitWeightMismatch { .. }), "{err}");
    shown.error("PermitWeightMismatch (extend)", &err);
    let err = wrong.release(&mut conn).await.unwrap_err();
    assert!(matches!(err, Error::PermitWeightMismatch { .. }), "{err}");
    shown.error("PermitWeightMismatch (release)", &err);
    let err = sem.acquire_as(&mut conn, &key, &id, 1).await.unwrap_err();
    assert!(matches!(err, Error::PermitWeightMismatch { .. }), "{err}");
    shown.error("PermitWeightMismatch (acquire)", &err);
    let err = PermitId::parse(&id.as_str().to_uppercase()).unwrap_err();
    shown.error("PermitId::parse", &err);
    let err = PermitId::parse(&format!("{} ", id.as_str())).unwrap_err();
    shown.error("PermitId::parse", &err);
    let permit_lease = sem
        .lease(conn.clone(), &format!("{p}leased-s"))
        .await
        .unwrap()
        .acquired()
        .expect("leased");
    let lease_id = permit_lease.permit().id().as_str().to_owned();
    shown.debug("PermitLease", &permit_lease);

    // Rate charges: a charge, a multi-limit charge, their refunds.
    let limiter = Limiter::new(Algorithm::Gcra, Quota::per_minute(10).unwrap()).unwrap();
    let decision = limiter
        .check(&mut conn, &format!("{p}rl"), 2)
        .await
        .unwrap();
    shown.debug("Decision", &decision);
    let mut charge = decision.into_charge().expect("admitted");
    let single_id = charge_id(&charge);
    shown.debug("Charge", &charge);
    // A refund that finds foreign data at the charge's record (whose key
    // holds the charge id) names the limit's key in its error.
    let record = nolock::keys::derive(&format!("{p}rl"), &format!("charge#{single_id}"));
    let _: () = redis::cmd("SET")
        .arg(&record)
        .arg("foreign")
        .query_async(&mut conn)
        .await
        .unwrap();
    shown.error(
        "a refund over a foreign record",
        &charge.refund(&mut conn, 1).await.unwrap_err(),
    );
    let _: () = redis::cmd("DEL")
        .arg(&record)
        .query_async(&mut conn)
        .await
        .unwrap();
    let refund = RefundCharge::new(&charge, 1).unwrap();
    shown.debug("RefundCharge", &refund);
    shown.debug(
        "Idempotent<RefundCharge>",
        &refund.idempotent(format!("{op_id}-refund")).unwrap(),
    );
    let limits = MultiLimiter::new(Algorithm::Gcra)
        .limit("user", Quota::per_minute(10).unwrap())
        .unwrap();
    let decision = limits.check(&mut conn, &format!("{p}ml"), 1).await.unwrap();
    shown.debug("MultiRateLimit", &decision);
    let multi = decision.into_charge().expect("admitted");
    let multi_id = charge_id(&multi);
    shown.debug("MultiCharge", &multi);

    let secrets = [
        ("lock token", token),
        ("lease token", lease_token),
        ("permit id", id.as_str().to_owned()),
        ("permit lease id", lease_id),
        ("charge id", single_id),
        ("multi-limit charge id", multi_id),
        ("operation id", op_id),
    ];
    shown.assert_none_of(&secrets);

    #[cfg(all(feature = "tracing", feature = "metrics"))]
    {
        let recorded = capture.finish();
        assert!(
            recorded
                .iter()
                .any(|(what, _)| what.starts_with("span nolock.script")),
            "spans were captured"
        );
        Shown(recorded).assert_none_of(&secrets);
    }
    drop((permit_lease, lease));
}

/// The id a charge carries: only its serialized form (a job's payload)
/// holds it.
fn charge_id(charge: &impl serde::Serialize) -> String {
    let wire = serde_json::to_value(charge).unwrap();
    wire["id"].as_str().expect("a charge id").to_owned()
}

/// Running one operation value alone, as a single call would.
trait RunIn: Operation + Sized {
    async fn run_in(self, conn: &mut redis::aio::MultiplexedConnection) -> Self::Output {
        Batch::from_iter([self])
            .run(conn)
            .await
            .remove(0)
            .expect("answered")
    }
}

impl<O: Operation> RunIn for O {}

#[cfg(all(feature = "tracing", feature = "metrics"))]
mod telemetry {
    //! Every span and event field, and every metric name and label, as
    //! text: (what, text).

    use std::sync::{Arc, Mutex};

    use metrics_util::debugging::{DebuggingRecorder, Snapshotter};

    #[derive(Default, Clone)]
    struct Captured(Arc<Mutex<Vec<(String, String)>>>);

    struct Fields<'a>(&'a mut Vec<(String, String)>, String);

    impl tracing::field::Visit for Fields<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0
                .push((format!("{} {}", self.1, field.name()), format!("{value:?}")));
        }
    }

    impl tracing::Subscriber for Captured {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            let mut all = self.0.lock().unwrap();
            let what = format!("span {}", span.metadata().name());
            span.record(&mut Fields(&mut all, what));
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
            let mut all = self.0.lock().unwrap();
            values.record(&mut Fields(
                &mut all,
                "span nolock.script (recorded)".into(),
            ));
        }
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            let mut all = self.0.lock().unwrap();
            let what = format!("event {}", event.metadata().level());
            event.record(&mut Fields(&mut all, what));
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    pub(super) struct Capture {
        spans: Captured,
        metrics: Snapshotter,
    }

    /// The process-wide subscriber and recorder: this test is the only one
    /// in its binary that installs them. Keys are recorded in spans too,
    /// the most a service can turn on.
    pub(super) fn install() -> Capture {
        let recorder = DebuggingRecorder::new();
        let metrics = recorder.snapshotter();
        recorder.install().unwrap();
        let spans = Captured::default();
        tracing::subscriber::set_global_default(spans.clone()).unwrap();
        nolock::record_keys_in_spans(true);
        Capture { spans, metrics }
    }

    impl Capture {
        pub(super) fn finish(self) -> Vec<(String, String)> {
            let mut all = self.spans.0.lock().unwrap().clone();
            for (key, _, _, _) in self.metrics.snapshot().into_vec() {
                let key = key.key();
                for label in key.labels() {
                    all.push((
                        format!("metric {} label {}", key.name(), label.key()),
                        label.value().to_owned(),
                    ));
                }
            }
            all
        }
    }
}
