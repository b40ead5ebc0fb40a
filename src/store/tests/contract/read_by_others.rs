//! Our lease documents as another lock pattern's clients read them
//! (`{_id, value, ttl, obtained_at}`: held until `obtained_at + ttl`
//! seconds, taken over in place once past it): held while live, free once
//! released or expired, and, once such a client took one over, its lock,
//! which no late write of the lease it was matches ("Read by other
//! clients" in `store`).

use crate::store::StoreExt;
use std::time::Duration;

use mongodb::bson::doc;
use uuid::Uuid;

use super::{Fixture, TTL, take};
use crate::store::{AcquireOutcome, HandoffOutcome, Store};

const VALUE: &str = "node-1";

/// That client locks `key` once its `exp` is past by its strict `>`: 1 ms
/// after an `exp` of `$$NOW`, so a few tries (the bound only turns a never
/// into a failure).
async fn lock_once_past<F: Fixture>(f: &F, key: &str, ttl_secs: i32) -> bool {
    for _ in 0..1_000 {
        if f.pattern2_lock(key, VALUE, ttl_secs).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    false
}

pub(super) async fn a_live_lease_reads_as_held_to_the_value_pattern<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    take(&a, "k").await;
    assert!(
        !f.pattern2_lock("k", VALUE, 10).await,
        "locked beside a live lease"
    );
    let (lease, _) = take(&a, "r").await;
    a.renew_with_ttl(vec![lease], TTL).await.unwrap();
    assert!(
        !f.pattern2_lock("r", VALUE, 10).await,
        "locked beside a renewed lease"
    );
}

pub(super) async fn a_released_lease_is_free_to_the_value_pattern_at_once<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    let (lease, _) = take(&a, "k").await;
    assert_eq!(a.release_by_id(vec![lease]).await.unwrap(), 1);
    assert!(
        lock_once_past(f, "k", 10).await,
        "the released lease still reads as held"
    );
    let b = f.store("b").await;
    match b.attempt("k".into(), Uuid::new_v4(), false).await.unwrap() {
        AcquireOutcome::Held { holder, .. } => assert_eq!(holder, VALUE),
        other => panic!("its lock must hold the key: {other:?}"),
    }
}

pub(super) async fn an_expired_lease_taken_over_by_the_value_pattern_is_its_lock<F: Fixture>(
    f: &F,
) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (lease, _) = take(&a, "k").await;
    f.expire("k").await;
    assert!(
        lock_once_past(f, "k", 30).await,
        "an expired lease reads as held"
    );

    // Held by its client, for us and for every late write of the lease.
    match b.attempt("k".into(), Uuid::new_v4(), false).await.unwrap() {
        AcquireOutcome::Held { holder, .. } => assert_eq!(holder, VALUE),
        other => panic!("taken over beside its lock: {other:?}"),
    }
    match a.attempt("k".into(), lease.lease_id, false).await.unwrap() {
        AcquireOutcome::Held { holder, .. } => assert_eq!(holder, VALUE),
        other => panic!("a retry of the lease it was won: {other:?}"),
    }
    assert_eq!(
        a.renew_with_ttl(vec![lease.clone()], TTL).await.unwrap(),
        vec![lease.clone()],
        "a late renewal revived the lease"
    );
    assert!(!a.set_payload(lease.clone(), doc! { "n": 1 }).await.unwrap());
    for light in [true, false] {
        let handed = a
            .handoff_to("k".into(), (lease.lease_id, Uuid::new_v4()), TTL, light)
            .await
            .unwrap();
        assert_eq!(handed, HandoffOutcome::Lost, "light: {light}");
    }
    assert_eq!(a.release_by_id(vec![lease]).await.unwrap(), 0);
    let info = a.inspect("k".into()).await.unwrap().expect("its lock");
    assert!(info.held && info.foreign, "{info:?}");
    assert_eq!(info.owner_id, VALUE);

    // Its lock is as it wrote it: its release finds it.
    assert!(f.pattern2_unlock("k", VALUE).await, "its lock was changed");
    assert!(matches!(
        b.attempt("k".into(), Uuid::new_v4(), false).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
}
