//! In-document leases through the public API, the creation of missing
//! documents: exactly once under concurrent acquires, only with `create`,
//! and never over a document that has fields of its own.

use std::future::IntoFuture;
use std::time::Duration;

use mongo_lease::{Error, ReleaseOutcome};
use mongodb::bson::{Document, doc};
use tokio_util::time::FutureExt as _;

use crate::common::{self, Fixture};
use crate::support::{HANG, connect_as, items, stored, work_items};

/// Four managers race for the same missing work items with
/// `AcquireDocument::create`, each with its own fields: each item is
/// created once, by the one winner, with the winner's fields; the others
/// find it held (`try_acquire`) or get it after the creator, as it stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_document_is_created_exactly_once_under_concurrent_acquires() {
    const ROUNDS: usize = 10;
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dcreate").await;
    let names = ["m0", "m1", "m2", "m3"];
    let mut managers = Vec::new();
    for name in names {
        managers.push(connect_as(&fx, name, TTL).await);
    }
    let mut handles = Vec::new();
    for manager in &managers {
        handles.push(work_items(manager).await);
    }
    let create = |name: &str| doc! { "created_by": name, "turns": 0 };

    for round in 0..ROUNDS {
        let id = format!("fresh-{round}");
        let attempts = handles.iter().zip(names).map(|(items, name)| {
            let (items, id, fields) = (items.clone(), id.clone(), create(name));
            tokio::spawn(async move {
                let lease = items.try_acquire(id).create(fields).await.unwrap();
                lease.map(|lease| (name, lease))
            })
        });
        // A hang guard only (HANG): the racing attempts take milliseconds here.
        let mut winners: Vec<_> = common::within(
            HANG,
            "the racing try_acquires",
            futures::future::join_all(attempts),
        )
        .await
        .into_iter()
        .filter_map(|r| r.unwrap())
        .collect();
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let (winner, lease) = winners.pop().unwrap();
        assert_eq!(
            lease.document(),
            &doc! { "_id": id.as_str(), "created_by": winner, "turns": 0 }
        );
        let count = items(&fx)
            .count_documents(doc! { "_id": id.as_str() })
            .await
            .unwrap();
        assert_eq!(count, 1);
        let mut item = stored(&fx, &id).await;
        assert!(item.remove("_lease").is_some(), "{item:?}");
        assert_eq!(
            item,
            doc! { "_id": id.as_str(), "created_by": winner, "turns": 0 }
        );
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    }

    // Waiting acquires: the creator's lease first, the others in turn after
    // it, each reading the item as the previous commit left it.
    let id = "waited";
    let turns = handles.iter().zip(names).map(|(items, name)| {
        let (items, fields) = (items.clone(), create(name));
        tokio::spawn(async move {
            let item = items.acquire(id).create(fields).await.unwrap();
            let seen = item.document().clone();
            item.commit(doc! { "$inc": { "turns": 1 }, "$push": { "by": name } })
                .await
                .unwrap();
            seen
        })
    });
    // A hang guard only (HANG): the four turns take milliseconds here.
    let seen: Vec<Document> = common::within(
        HANG,
        "the waiting acquires' turns",
        futures::future::join_all(turns),
    )
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let count = items(&fx)
        .count_documents(doc! { "_id": id })
        .await
        .unwrap();
    assert_eq!(count, 1);
    let item = stored(&fx, id).await;
    assert_eq!(item.get_i32("turns").unwrap(), 4, "{item:?}");
    let by: Vec<&str> = item
        .get_array("by")
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap())
        .collect();
    let creator = item.get_str("created_by").unwrap();
    assert_eq!(
        by.first(),
        Some(&creator),
        "the creator's turn came first: {item:?}"
    );
    let mut sorted = by.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, names);
    for s in &seen {
        assert_eq!(
            s.get_str("created_by").unwrap(),
            creator,
            "re-created: {s:?}"
        );
    }
    let mut first_reads: Vec<i32> = seen.iter().map(|s| s.get_i32("turns").unwrap()).collect();
    first_reads.sort_unstable();
    assert_eq!(first_reads, [0, 1, 2, 3]);
    for manager in managers {
        manager.shutdown().await.unwrap();
    }
}

/// The fields to create are given to a missing item, and to an item that
/// holds nothing but its `_id`; an item with fields of its own keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_fills_a_missing_or_bare_document_and_leaves_others_as_they_are() {
    let fx = Fixture::new("dbare").await;
    items(&fx)
        .insert_many([
            doc! { "_id": "bare" },
            doc! { "_id": "full", "state": "mine" },
        ])
        .await
        .unwrap();
    let manager = connect_as(&fx, "holder", Duration::from_secs(30)).await;
    let handle = work_items(&manager).await;
    let fields = doc! { "state": "new", "runs": 0 };
    for (id, expected) in [
        (
            "missing",
            doc! { "_id": "missing", "state": "new", "runs": 0 },
        ),
        ("bare", doc! { "_id": "bare", "state": "new", "runs": 0 }),
        ("full", doc! { "_id": "full", "state": "mine" }),
    ] {
        let item = handle.acquire(id).create(fields.clone()).await.unwrap();
        assert_eq!(item.document(), &expected, "{id}");
        assert_eq!(item.release().await.unwrap(), ReleaseOutcome::Released);
    }
    manager.shutdown().await.unwrap();
    assert_eq!(items(&fx).count_documents(doc! {}).await.unwrap(), 3);
    assert_eq!(
        stored(&fx, "full").await,
        doc! { "_id": "full", "state": "mine" }
    );
}

/// Without fields to create it, a missing item is `DocumentNotFound`, in
/// every acquire variant, and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_document_without_create_is_not_found_and_not_created() {
    let fx = Fixture::new("dmissing").await;
    let manager = connect_as(&fx, "holder", Duration::from_secs(30)).await;
    let handle = work_items(&manager).await;
    let not_found = |result: &mongo_lease::Result<_>| {
        matches!(result, Err(Error::DocumentNotFound { id, .. })
            if id == &mongo_lease::LeaseKey::from("missing"))
    };
    let r = handle.acquire("missing").await.map(drop);
    assert!(not_found(&r), "{r:?}");
    let r = handle.try_acquire("missing").await.map(drop);
    assert!(not_found(&r), "{r:?}");
    let r = handle
        .acquire("missing")
        .into_future()
        .timeout(HANG)
        .await
        .ok()
        .transpose()
        .map(drop);
    assert!(not_found(&r), "{r:?}");
    assert_eq!(items(&fx).count_documents(doc! {}).await.unwrap(), 0);
    manager.shutdown().await.unwrap();
}
