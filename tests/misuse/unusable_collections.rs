//! Lock collections the protocol cannot work with (a unique index on the
//! owner id, an index named like the GC index, a refusing validator, a
//! view): refused with a clear error, nothing written.

use std::time::Duration;

use futures::TryStreamExt;
use mongo_lease::{Error, LeaseManager, ReleaseOutcome};
use mongodb::IndexModel;
use mongodb::bson::doc;

use crate::common::Fixture;
use crate::support::{BOUND, TTL, bounded};

/// A unique index on the owner id contradicts the protocol (one manager
/// holds many leases): `connect` refuses such a collection with a clear,
/// permanent error, and creates nothing in it.
#[tokio::test]
async fn a_unique_index_on_the_owner_id_is_refused_at_connect() {
    let fx = Fixture::new("unique_aid").await;
    fx.raw().create_index(unique_on_aid()).await.unwrap();
    let mut options = fx.options(TTL).await;
    options.operation_timeout = Duration::from_secs(2);
    let (result, took) = bounded(
        "connect to a collection with a unique index on aid",
        BOUND,
        LeaseManager::connect(options),
    )
    .await;
    let e = result.expect_err("a unique index on aid must be refused");
    eprintln!("unique index on aid at connect: {e} (after {took:?})");
    assert!(matches!(e, Error::UnusableCollection { .. }), "{e}");
    assert!(!e.is_transient(), "a permanent error, not {e}");
    let mut names: Vec<String> = fx.raw().list_index_names().await.unwrap();
    names.sort();
    assert_eq!(names, ["_id_", "aid_1"], "no index created");
    assert_eq!(
        fx.raw().count_documents(doc! {}).await.unwrap(),
        0,
        "no document written"
    );
}

/// The same index created after `connect` checked the collection: the
/// duplicate-key error of a second lease of the manager names that index,
/// not `_id_`, and must not be read as "held" (which would wait for ever):
/// both `try_acquire` and `acquire` end with a clear, permanent error within
/// a bounded time, and the first lease is unaffected.
#[tokio::test]
async fn a_unique_index_on_the_owner_id_created_later_is_a_clear_error() {
    let fx = Fixture::new("unique_aid_late").await;
    let mut options = fx.options(TTL).await;
    options.operation_timeout = Duration::from_secs(2);
    let manager = LeaseManager::connect(options).await.unwrap();
    fx.raw().create_index(unique_on_aid()).await.unwrap();
    let first = manager.acquire("a").await.unwrap();
    let (second, took) = bounded(
        "try_acquire of a second key under a unique index on aid",
        BOUND,
        manager.try_acquire("b"),
    )
    .await;
    let e = second.unwrap_err();
    eprintln!("unique index on aid, try_acquire: {e} (after {took:?})");
    assert!(matches!(e, Error::UnusableCollection { .. }), "{e}");
    assert!(!e.is_transient(), "a permanent error, not {e}");
    let (second, took) = bounded(
        "a second acquire under a unique index on aid",
        BOUND,
        manager.acquire("b"),
    )
    .await;
    let e = second.unwrap_err();
    eprintln!("unique index on aid, acquire: {e} (after {took:?})");
    assert!(matches!(e, Error::UnusableCollection { .. }), "{e}");
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// A unique index on the owner id field `aid`.
fn unique_on_aid() -> IndexModel {
    IndexModel::builder()
        .keys(doc! { "aid": 1 })
        .options(
            mongodb::options::IndexOptions::builder()
                .unique(true)
                .build(),
        )
        .build()
}

/// An index named like the manager's TTL index but on another field: the
/// manager must not take it for its garbage collection.
#[tokio::test]
async fn an_index_named_like_the_gc_index_is_not_taken_for_it() {
    let fx = Fixture::new("samename").await;
    fx.raw()
        .create_index(
            IndexModel::builder()
                .keys(doc! { "ts": 1 })
                .options(
                    mongodb::options::IndexOptions::builder()
                        .name("mongo_lease_gc".to_string())
                        .build(),
                )
                .build(),
        )
        .await
        .unwrap();
    match LeaseManager::connect(fx.options(TTL).await).await {
        Err(e) => {
            eprintln!("same-name index refused: {e}");
            assert!(matches!(e, Error::UnusableCollection { .. }), "{e}");
        }
        Ok(manager) => {
            manager.shutdown().await.unwrap();
            let indexes: Vec<IndexModel> = fx
                .raw()
                .list_indexes()
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            let ttl = indexes.iter().any(|i| {
                i.keys == doc! { "exp": 1 }
                    && i.options.as_ref().and_then(|o| o.expire_after).is_some()
            });
            assert!(
                ttl,
                "connected, but no TTL index on exp exists: lock documents are never collected ({indexes:?})"
            );
        }
    }
}

/// A validator that refuses lock documents, and a view in place of the
/// collection: a clear error each, not a hang, nothing written.
#[tokio::test]
async fn a_refusing_validator_or_a_view_is_a_clear_error() {
    let fx = Fixture::new("validator").await;
    fx.db
        .create_collection(&fx.collection)
        .validator(doc! { "owner": { "$exists": true } })
        .await
        .unwrap();
    let manager = fx.manager(TTL).await;
    let (r, took) = bounded(
        "acquire under a refusing validator",
        BOUND,
        manager.acquire("v"),
    )
    .await;
    let e = r.unwrap_err();
    eprintln!("validator: {e} after {took:?}");
    assert!(!e.is_transient(), "{e}");
    assert!(e.to_string().contains("Document failed validation"), "{e}");
    assert_eq!(fx.raw().count_documents(doc! {}).await.unwrap(), 0);
    manager.shutdown().await.unwrap();

    fx.db
        .create_collection("view.lock")
        .view_on("somewhere".to_string())
        .pipeline(vec![])
        .await
        .unwrap();
    let mut options = fx.options(TTL).await;
    options.collection = "view.lock".into();
    let e = LeaseManager::connect(options).await.unwrap_err();
    assert!(matches!(e, Error::UnusableCollection { .. }), "{e}");
}

/// A validator set after the acquisition that refuses the released
/// document: the release is a clear error, not a lease reported lost, and
/// the stored lease is left as it was (it expires by its TTL).
#[tokio::test]
async fn a_validator_refusing_the_released_document_makes_the_release_an_error() {
    let fx = Fixture::new("validator_release").await;
    let manager = fx.manager(TTL).await;
    let lease = manager.acquire("r").await.unwrap();
    let stored = fx
        .raw()
        .find_one(doc! { "_id": "r" })
        .await
        .unwrap()
        .unwrap();
    fx.db
        .run_command(doc! {
            "collMod": &fx.collection,
            "validator": { "lid": { "$exists": true } },
            "validationLevel": "strict",
        })
        .await
        .unwrap();
    let (r, took) = bounded("release under a refusing validator", BOUND, lease.release()).await;
    let e = r.unwrap_err();
    eprintln!("release under a refusing validator: {e} after {took:?}");
    assert!(e.to_string().contains("Document failed validation"), "{e}");
    let after = fx
        .raw()
        .find_one(doc! { "_id": "r" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after, stored, "the stored lease unchanged");
    manager.shutdown().await.unwrap();
}
