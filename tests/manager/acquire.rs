//! Acquire, try-acquire, release and fencing tokens against a real mongod.

use crate::common;

use std::future::IntoFuture;
use std::time::Duration;

use common::Fixture;
use mongo_lease::ReleaseOutcome;
use mongodb::bson::doc;
use tokio_util::time::FutureExt as _;

const TTL: Duration = Duration::from_secs(10);

#[tokio::test]
async fn uncontended_acquire_stores_one_document_with_server_time() {
    let fx = Fixture::new("store_doc").await;
    let manager = fx.manager(TTL).await;
    let lease = manager
        .try_acquire("job-1")
        .await
        .unwrap()
        .expect("free key");
    assert_eq!(lease.key(), "job-1");
    assert_eq!(lease.owner_id(), manager.owner_id());
    assert!(!lease.status().is_lost());

    let doc = fx.doc("job-1").await;
    assert_eq!(doc.get_str("aid").unwrap(), manager.owner_id());
    assert_eq!(doc.get_i64("tok").unwrap() as u64, lease.fencing_token());
    let ts = doc.get_datetime("ts").unwrap().timestamp_millis();
    let exp = doc.get_datetime("exp").unwrap().timestamp_millis();
    assert_eq!(
        exp - ts,
        TTL.as_millis() as i64,
        "exp = ts + ttl, both server time"
    );
    assert!(doc.get("lid").is_some());

    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    let doc = fx.doc("job-1").await;
    assert!(
        doc.get("lid").is_none(),
        "a released lease has no lease id: {doc:?}"
    );
    manager.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_key_held_by_another_manager_is_not_an_error() {
    let fx = Fixture::new("held_other").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let lease = a.try_acquire("k").await.unwrap().expect("free");
    assert!(b.try_acquire("k").await.unwrap().is_none());
    assert!(
        b.acquire("k")
            .into_future()
            .timeout(Duration::from_millis(300))
            .await
            .ok()
            .transpose()
            .unwrap()
            .is_none()
    );
    drop(lease);
    // Dropping releases in the background; the waiting manager then gets it.
    let lease = b
        .acquire("k")
        .into_future()
        .timeout(Duration::from_secs(10))
        .await
        .ok()
        .transpose()
        .unwrap();
    assert!(lease.is_some(), "dropped lease was released");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn fencing_tokens_strictly_increase_across_release_and_takeover() {
    let fx = Fixture::new("fencing").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let mut last = 0;
    for round in 0..6 {
        let manager = if round % 2 == 0 { &a } else { &b };
        let lease = manager.acquire("fenced").await.unwrap();
        assert!(
            lease.fencing_token() > last,
            "round {round}: {} <= {last}",
            lease.fencing_token()
        );
        last = lease.fencing_token();
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    }
    // Expiry takeover: make a's lease look expired on the server.
    let lease = a.acquire("fenced").await.unwrap();
    let t1 = lease.fencing_token();
    let taken = fx.take_over("fenced", &b).await;
    assert!(taken.fencing_token() > t1);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn fencing_token_grows_after_the_document_is_deleted() {
    let fx = Fixture::new("fencing_gc").await;
    let m = fx.manager(TTL).await;
    let lease = m.acquire("gc").await.unwrap();
    let t1 = lease.fencing_token();
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    // What the TTL monitor does to a released document.
    fx.raw().delete_one(doc! { "_id": "gc" }).await.unwrap();
    let lease = m.acquire("gc").await.unwrap();
    assert!(
        lease.fencing_token() > t1,
        "{} <= {t1}",
        lease.fencing_token()
    );
    m.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_is_a_clear_error() {
    let fx = Fixture::new("bad_input").await;
    let m = fx.manager(TTL).await;
    let e = m.try_acquire("").await.unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    let e = m
        .acquire("x".repeat(mongo_lease::MAX_KEY_LEN + 1))
        .await
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e}");

    fx.raw()
        .insert_one(doc! { "_id": "foreign", "payload": "keep me" })
        .await
        .unwrap();
    // Another application's document is a lock held by a foreign holder.
    assert!(m.try_acquire("foreign").await.unwrap().is_none());
    let waited = m
        .acquire("foreign")
        .into_future()
        .timeout(Duration::from_millis(200))
        .await
        .ok()
        .transpose()
        .unwrap();
    assert!(waited.is_none());
    let doc = fx.doc("foreign").await;
    assert_eq!(
        doc,
        doc! { "_id": "foreign", "payload": "keep me" },
        "left untouched"
    );
    m.shutdown().await.unwrap();
}
