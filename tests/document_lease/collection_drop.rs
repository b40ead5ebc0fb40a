//! The user drops the collection of in-document leases while leases in it
//! are held.

use std::time::Duration;

use mongo_lease::{DocumentAcquireOptions, DocumentLeases, LockManager, ReleaseOutcome};
use mongodb::bson::{Document, doc};

use crate::common::Fixture;

/// The user collection of work items.
const ITEMS: &str = "workitem";

/// Bound that only turns a hang into a failure: the loss is found by the
/// next heartbeat (every TTL / 3, one second here).
const HANG: Duration = Duration::from_secs(60);

/// Dropping the collection takes the documents and their lock fields: the
/// holder's token fires (its lock is gone), its commit is refused without
/// writing (no document is created), the manager keeps serving the
/// collection, and a lease of the re-created document has a greater fencing
/// token than the dropped one (the token's time part, `$$NOW`, has moved on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_collection_loses_its_leases_and_later_tokens_are_greater() {
    const TTL: Duration = Duration::from_secs(3);
    let fx = Fixture::new("ddrop").await;
    let items = fx.db.collection::<Document>(ITEMS);
    items
        .insert_one(doc! { "_id": "item", "state": "new" })
        .await
        .unwrap();
    let manager = LockManager::connect(fx.options(TTL).await).await.unwrap();
    let handle: DocumentLeases = manager.documents(ITEMS).await.unwrap();
    let item = handle.acquire("item").await.unwrap();
    let old_token = item.lease().fencing_token();

    items.drop().await.unwrap();
    tokio::time::timeout(HANG, item.lease().lost())
        .await
        .expect("the dropped lease's token did not fire");
    let commit = item.commit(doc! { "$set": { "state": "written" } }).await;
    assert!(
        matches!(commit, Err(mongo_lease::Error::LeaseLost { .. })),
        "{commit:?}"
    );
    assert_eq!(items.count_documents(doc! {}).await.unwrap(), 0);

    let options = DocumentAcquireOptions::builder()
        .create(doc! { "state": "again" })
        .build();
    let again = tokio::time::timeout(HANG, handle.acquire_with("item", options))
        .await
        .expect("acquire after the drop hung")
        .unwrap();
    assert!(
        again.lease().fencing_token() > old_token,
        "{} after {old_token}",
        again.lease().fencing_token()
    );
    assert_eq!(again.document(), &doc! { "_id": "item", "state": "again" });
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}
