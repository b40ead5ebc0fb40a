//! Documents mongo-lease did not write, or rewritten by hand: held by a
//! foreign holder and never modified, or a lost lease.

use std::future::IntoFuture;
use std::time::Duration;

use mongo_lease::{LeaseManager, ReleaseOutcome};
use mongodb::bson::{Bson, Document, doc};
use tokio_util::time::FutureExt as _;

use crate::common::Fixture;
use crate::support::{BOUND, TTL, bounded};

/// Documents not written by mongo-lease, of many layouts, are never modified
/// or deleted: each is a lock held by a foreign holder, so `try_acquire`
/// returns `None`, a waiting acquire keeps waiting, and `inspect` shows it
/// held by a foreign holder. Keys next to them work normally.
#[tokio::test]
async fn documents_of_foreign_shape_are_held_by_foreign_holders_and_left_untouched() {
    let fx = Fixture::new("foreign").await;
    // The GC TTL index on `exp` deletes any document whose `exp` is a date,
    // foreign or not, `gc_grace` after it: keep it away from these.
    let mut options = fx.options(TTL).await;
    options.gc_grace = Duration::from_secs(3600);
    let manager = LeaseManager::connect(options).await.unwrap();
    let past = mongodb::bson::DateTime::from_millis(
        mongodb::bson::DateTime::now().timestamp_millis() - 1_000,
    );
    let shapes: Vec<Document> = vec![
        doc! { "_id": "payload", "payload": "keep me" },
        doc! { "_id": "exp-string", "exp": "yesterday", "tok": 5_i64 },
        doc! { "_id": "tok-int32", "exp": past, "tok": 5_i32 },
        doc! { "_id": "tok-double", "exp": past, "tok": 5.0 },
        doc! { "_id": "exp-number", "exp": 0_i64, "tok": 5_i64 },
        doc! { "_id": "exp-null", "exp": Bson::Null, "tok": 5_i64 },
        doc! { "_id": "tok-missing", "exp": past, "aid": "someone" },
        doc! { "_id": "nested", "exp": { "when": past }, "tok": 1_i64 },
        doc! { "_id": "array", "exp": [past], "tok": [1_i64] },
    ];
    fx.raw().insert_many(shapes.clone()).await.unwrap();
    for shape in &shapes {
        let key = shape.get_str("_id").unwrap();
        assert!(manager.try_acquire(key).await.unwrap().is_none(), "{key}");
        let waited = manager
            .acquire(key)
            .into_future()
            .timeout(Duration::from_millis(100))
            .await
            .ok()
            .transpose()
            .unwrap();
        assert!(waited.is_none(), "{key}");
        let info = manager.inspect(key).await.unwrap().expect("a foreign lock");
        assert!(info.foreign && info.held, "{key}: {info:?}");
    }
    // Neighbours work, release_all and shutdown leave the foreign documents alone.
    let lease = manager.acquire("mine").await.unwrap();
    manager.release_all().await.unwrap();
    assert!(lease.status().is_lost());
    let _again = manager.acquire("mine").await.unwrap();
    manager.shutdown().await.unwrap();
    for shape in &shapes {
        let stored = fx
            .raw()
            .find_one(doc! { "_id": shape.get_str("_id").unwrap() })
            .await
            .unwrap();
        assert_eq!(stored.as_ref(), Some(shape), "left untouched");
    }
}

/// A document of our layout whose `aid`/`lid` were rewritten by hand while a
/// lease was held: the holder's renewal no longer matches, so it is told it
/// lost the lease; the next owner gets a higher token.
#[tokio::test]
async fn a_lease_document_rewritten_by_hand_is_a_lost_lease() {
    let fx = Fixture::new("rewritten").await;
    let (a, b) = (
        fx.manager(Duration::from_secs(2)).await,
        fx.manager(Duration::from_secs(2)).await,
    );
    let lease = a.acquire("k").await.unwrap();
    fx.raw()
        .update_one(
            doc! { "_id": "k" },
            doc! { "$set": { "lid": "not-a-uuid", "aid": "intruder" } },
        )
        .await
        .unwrap();
    bounded("the lost-lease signal", BOUND, lease.status().lost()).await;
    let next = bounded("takeover", BOUND, b.acquire("k")).await.0.unwrap();
    assert!(next.fencing_token() > lease.fencing_token());
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
    a.shutdown().await.unwrap();
    drop(next);
    b.shutdown().await.unwrap();
}
