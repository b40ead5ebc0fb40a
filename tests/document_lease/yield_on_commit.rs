//! Fairness between owners when a commit releases a lease another owner
//! waited for: the commit yields the document (as a release does), by update
//! operators and by an update pipeline alike.

use std::time::Duration;

use mongo_lease::{DocumentUpdate, LeaseManager, ReleaseOutcome};
use mongodb::bson::doc;

use crate::common::{self, Fixture};
use crate::support::{HANG, connect_as, items, lock_fields, work_items};

/// The holder's yield window (its `retry_max`): far longer than the test.
const YIELD: Duration = Duration::from_secs(3600);

/// A third manager waits for `id` until its mark (`_lease.wt`) is stored,
/// then gives up (it shuts down: no attempt of it is left in flight).
async fn mark_as_waited(fx: &Fixture, id: &'static str) {
    let waiter = connect_as(fx, "waiter", Duration::from_secs(30)).await;
    let docs = work_items(&waiter).await;
    let waiting = tokio::spawn(async move { docs.acquire(id).await.map(|_| ()) });
    common::eventually("the waiter's mark is stored", HANG, || async {
        lock_fields(fx, id)
            .await
            .is_some_and(|l| l.contains_key("wt"))
    })
    .await;
    waiting.abort();
    assert!(waiting.await.is_err_and(|e| e.is_cancelled()));
    waiter.shutdown().await.unwrap();
}

/// A lease another owner waited for (`wt`), committed by update operators
/// or by a pipeline, ends yielded: the update is written, the lock field is
/// released (no lease id nor mark, the token kept) with `yu` set, the
/// committing owner cannot take the document back within its yield window,
/// and another owner takes it at once, with a greater token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_of_a_lease_another_owner_waited_for_yields_the_document() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dyield").await;
    items(&fx)
        .insert_many([
            doc! { "_id": "ops", "n": 0 },
            doc! { "_id": "pipe", "n": 0 },
        ])
        .await
        .unwrap();
    let mut options = fx.options(TTL).await;
    options.retry_max = YIELD;
    let holder = LeaseManager::connect(options).await.unwrap();
    let other = connect_as(&fx, "other", TTL).await;
    let mine = work_items(&holder).await;
    let theirs = work_items(&other).await;

    let updates: [(&'static str, DocumentUpdate); 2] = [
        ("ops", doc! { "$inc": { "n": 1 } }.into()),
        (
            "pipe",
            vec![doc! { "$set": { "n": { "$add": ["$n", 1] } } }].into(),
        ),
    ];
    for (id, update) in updates {
        let item = mine.acquire(id).await.unwrap();
        let token = item.lease().fencing_token();
        mark_as_waited(&fx, id).await;

        let committed = item.commit(update).await.unwrap();
        assert_eq!(committed, doc! { "_id": id, "n": 1 }, "{id}");
        let lock = lock_fields(&fx, id).await.expect("a yielded lock field");
        assert!(!lock.contains_key("lid"), "{id}: {lock}");
        assert!(!lock.contains_key("wt"), "{id}: {lock}");
        assert_eq!(lock.get_i64("tok").ok(), i64::try_from(token).ok(), "{id}");
        assert!(lock.get_datetime("yu").is_ok(), "{id}: {lock}");

        assert!(
            mine.try_acquire(id).await.unwrap().is_none(),
            "{id}: the committing owner took the document back within its yield window"
        );
        let next = theirs
            .try_acquire(id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{id}: not free for another owner"));
        assert!(next.lease().fencing_token() > token, "{id}");
        assert_eq!(next.document(), &doc! { "_id": id, "n": 1 });
        assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    }
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}
