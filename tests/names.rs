//! User-chosen names cannot collide: resources `x` and `{x}` are
//! independent locks and fences, and user ids `alice` and `{alice}` are
//! independent multi-limiters, on a real redis-server. The key layout itself
//! is proven injective by the property test in `src/keys.rs`.

mod support;

use std::time::Duration;

use nolock::fence::{self, LockAttempt, Write};
use nolock::rate::{Algorithm, MultiLimiter, Quota};
use support::prefix;

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn x_and_braced_x_are_independent_fence_resources() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("names-fence");
    // On main both names used `{x}:lock` and `{x}:fence`.
    for (plain, braced) in [
        (format!("{p}x"), format!("{{{p}x}}")),
        (format!("{p}a}}b"), format!("{{{p}a}}}}b")),
    ] {
        let LockAttempt::Acquired(a) = nolock::fence::Lock::new(MINUTE)
            .expect("a valid lock TTL")
            .acquire(&mut conn, &plain)
            .await
            .unwrap()
        else {
            panic!("{plain} is free")
        };
        let LockAttempt::Acquired(b) = nolock::fence::Lock::new(MINUTE)
            .expect("a valid lock TTL")
            .acquire(&mut conn, &braced)
            .await
            .unwrap()
        else {
            panic!("{braced} is free, though {plain} is held")
        };
        assert_eq!(
            (a.fence().number(), b.fence().number()),
            (1, 1),
            "separate counters"
        );
        assert_eq!(
            a.fence().write(&mut conn, "plain").await.unwrap(),
            Write::Applied
        );
        assert_eq!(
            b.fence().write(&mut conn, "braced").await.unwrap(),
            Write::Applied
        );
        let plain_value = fence::read(&mut conn, &plain).await.unwrap().unwrap();
        assert_eq!(plain_value.value, b"plain");
        let braced_value = fence::read(&mut conn, &braced).await.unwrap().unwrap();
        assert_eq!(braced_value.value, b"braced");
    }
}

#[tokio::test]
async fn alice_and_braced_alice_are_independent_multi_limiters() {
    let redis = support::redis();
    let mut conn = redis.conn().await;
    let p = prefix("names-multi");
    let limits = MultiLimiter::new(Algorithm::FixedWindow)
        .limit("minute", Quota::per_minute(2).unwrap())
        .unwrap();
    let alice = format!("{p}alice");
    let braced = format!("{{{p}alice}}");
    for _ in 0..2 {
        assert!(limits.check(&mut conn, &alice, 1).await.unwrap().allowed);
    }
    assert!(!limits.check(&mut conn, &alice, 1).await.unwrap().allowed);
    // On main `{alice}` shared alice's counter and was denied here.
    for _ in 0..2 {
        let d = limits.check(&mut conn, &braced, 1).await.unwrap();
        assert!(d.allowed, "{braced} has its own limit");
    }
    assert!(!limits.check(&mut conn, &braced, 1).await.unwrap().allowed);
}
