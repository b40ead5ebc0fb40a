//! The user drops the collection of in-document leases while leases in it
//! are held.

use std::time::Duration;

use mongo_lease::ReleaseOutcome;
use mongodb::bson::doc;

use crate::common::Fixture;
use crate::support::{HANG, item_and_holder, items};

/// Dropping the collection takes the documents and their lock fields: the
/// holder's token fires (its lock is gone), its commit is refused without
/// writing (no document is created), the manager keeps serving the
/// collection, and a lease of the re-created document has a greater fencing
/// token than the dropped one (the token's time part, `$$NOW`, has moved on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_collection_loses_its_leases_and_later_tokens_are_greater() {
    const TTL: Duration = Duration::from_secs(3);
    let fx = Fixture::new("ddrop").await;
    let (manager, handle) = item_and_holder(&fx, doc! { "_id": "item", "state": "new" }, TTL).await;
    let item = handle.acquire("item").await.unwrap();
    let old_token = item.lease().fencing_token();

    items(&fx).drop().await.unwrap();
    // The loss is found by the next heartbeat (every TTL / 3, one second
    // here).
    tokio::time::timeout(HANG, item.lease().status().lost())
        .await
        .expect("the dropped lease's token did not fire");
    let commit = item.commit(doc! { "$set": { "state": "written" } }).await;
    assert!(
        matches!(commit, Err(mongo_lease::Error::LeaseLost { .. })),
        "{commit:?}"
    );
    assert_eq!(items(&fx).count_documents(doc! {}).await.unwrap(), 0);

    let acquire = handle.acquire("item").create(doc! { "state": "again" });
    let again = tokio::time::timeout(HANG, acquire)
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
