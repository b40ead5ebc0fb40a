//! `DocumentLeases::inspect`: a document's lease read with the server's
//! clock, as `LockManager::inspect` reads a key.

use std::time::Duration;

use mongo_lease::{DocumentLeases, LockManager};
use mongodb::bson::{Document, doc};

use crate::common::Fixture;

/// The user collection of work items.
const ITEMS: &str = "workitem";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_who_holds_a_documents_lease_and_nothing_for_an_unleased_one() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dinspect").await;
    let items = fx.db.collection::<Document>(ITEMS);
    items
        .insert_many([
            doc! { "_id": "item", "state": "new" },
            doc! { "_id": "theirs", "_lease": "mine, hands off" },
        ])
        .await
        .unwrap();
    let manager = LockManager::connect(fx.options(TTL).await).await.unwrap();
    let handle: DocumentLeases = manager.documents(ITEMS).await.unwrap();

    assert_eq!(handle.inspect("item").await.unwrap(), None, "never leased");
    assert_eq!(
        handle.inspect("missing").await.unwrap(),
        None,
        "no document"
    );
    // The lock collection knows nothing of a document's lease.
    let item = handle.acquire("item").await.unwrap();
    assert_eq!(manager.inspect("item").await.unwrap(), None);

    let info = handle.inspect("item").await.unwrap().expect("a held lease");
    assert!(info.held, "{info:?}");
    assert!(!info.foreign, "{info:?}");
    assert_eq!(info.owner_id, manager.owner_id());
    assert_eq!(info.fencing_token, item.lease().fencing_token());
    assert!(info.time_to_expiry() > Duration::ZERO);
    assert!(info.time_to_expiry() <= TTL);

    item.commit(doc! { "$set": { "state": "done" } })
        .await
        .unwrap();
    // Just released: no lock field, or one in the released state.
    if let Some(info) = handle.inspect("item").await.unwrap() {
        assert!(!info.held, "{info:?}");
    }

    let foreign = handle
        .inspect("theirs")
        .await
        .unwrap()
        .expect("a foreign holder's lock");
    assert!(foreign.foreign, "{foreign:?}");
    assert!(foreign.held, "{foreign:?}");
    manager.shutdown().await.unwrap();
}
